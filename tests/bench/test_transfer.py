"""``kvtier bench transfer`` on CPU: round trips bit-exact, copies and overlap measured, user
errors refused in one line; and its torch-only pool matches vLLM's own layout helpers."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from kvtier.bench.transfer import TransferBenchConfig, run_transfer_bench  # noqa: E402
from kvtier.bench.transfer_kv import LAYOUT_ORDERS, KVShape, paged_kv  # noqa: E402
from kvtier.cli.main import app  # noqa: E402
from kvtier.errors import ConfigError  # noqa: E402
from kvtier.testing.cli import run_cli  # noqa: E402


@pytest.mark.parametrize("layout", sorted(LAYOUT_ORDERS))
def test_the_torch_only_pool_has_the_strides_vllms_helpers_give(layout):
    pytest.importorskip("vllm")
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheLayout,
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )

    shape = KVShape(layers=3, blocks=10, kv_heads=2, block_size=16, head_dim=32)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.bfloat16)
    strides = compute_layout_strides(spec, 10, 3, KVCacheLayout[layout])
    raw = torch.zeros(shape.nbytes, dtype=torch.int8)
    tensor = KVCacheTensor(
        size=shape.nbytes, layers=["a", "b", "c"], layer_stride=strides[0], block_stride=strides[1]
    )
    theirs = create_kv_cache_views(raw, spec, 10, KVCacheLayout[layout], tensor)
    _, ours = paged_kv(shape, layout)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.shape, a.stride(), a.storage_offset(), a.dtype) == (
            b.shape, b.stride(), b.storage_offset(), b.dtype
        )  # fmt: skip


@pytest.mark.parametrize("layout", ["LBNHC", "BHLNC", "LHBNC"])
def test_a_small_run_round_trips_every_tier_exactly_and_reports_every_figure(tmp_path, layout):
    config = TransferBenchConfig(
        model="smollm2-135m", layout=layout, tokens=512, repeats=1, directory=tmp_path
    )
    steps: list[str] = []
    report = run_transfer_bench(config, steps.append)
    assert [r["tier"] for r in report.round_trips] == ["memory", "slab", "file"]
    assert all(r["exact"] and r["read"] == 2 for r in report.round_trips)
    assert set(report.copies) == {"to_host", "to_device", "to_device_layerwise"}
    assert all(c["engine_gbps"] > 0 and c["share_of_plain"] > 0 for c in report.copies.values())
    o = report.overlap
    assert 0 < o["first_layer_usable_s"] <= o["last_layer_usable_s"]
    assert o["forward_alone_s"] > 0 and o["chunks"] == 2
    assert report.gds["available"] is False and "host memory" in report.gds["reason"]
    f = report.file_io  # on CPU the device verbs read into CPU tensors over POSIX
    assert f["library"].startswith("posix") and f["exact"] is True and f["chunks"] == 2
    assert all(f[k] > 0 for k in ("read_staged_gbps", "read_straight_gbps", "write_straight_gbps"))
    assert steps and "building" in steps[0]


def test_the_command_prints_json_with_its_command_and_targets(monkeypatch, capsys, tmp_path):
    code, out, err = run_cli(
        app, monkeypatch, capsys, "bench", "transfer", "--model", "smollm2-135m",
        "--tokens", "256", "--repeat", "1", "--tiers", "memory", "--dir", str(tmp_path), "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "kvtier.bench.transfer/1"
    assert doc["command"].startswith("kvtier bench transfer")
    assert doc["targets"]["round_trips_exact"] is True
    assert doc["config"]["device"] == "cpu" and doc["chunk_bytes"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cuda:7"], "sees no CUDA device|only"),
        (["--layout", "XYZ"], "use one of"),
        (["--tiers", "tape"], "use some of"),
        (["--chunk-tokens", "40"], "whole number"),
        (["--staging", "lots"], "size"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(monkeypatch, capsys, args, message):
    if torch.cuda.is_available() and args[0] == "--device":
        pytest.skip("this machine has CUDA")
    code, _, err = run_cli(app, monkeypatch, capsys, "bench", "transfer", *args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    import re

    assert re.search(message, lines[0]), lines[0]


def test_a_config_is_checked_when_made():
    with pytest.raises(ConfigError, match="at least one chunk"):
        TransferBenchConfig(tokens=100)
