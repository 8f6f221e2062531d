"""``kvtier bench peers``' settings, the helpers of its run and the targets its report derives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtier.bench.peers import PeersConfig, PeersReport, SystemResult, turned, twin_url
from kvtier.bench.peers_report import passed, targets
from kvtier.bench.peers_systems import Prompt, bad_chunks
from kvtier.bench.stats import LatencyStats
from kvtier.errors import ConfigError


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"payload": "noise"}, "--payload is one of"),
        ({"model": "llama-3-8b"}, "use --payload synthetic"),
        ({"prefix_tokens": 1000}, "whole number of 256-token chunks"),
        ({"requests": 0}, "--requests must be at least 1"),
        ({"depths": (0,)}, "positive"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kw, message):
    with pytest.raises(ConfigError, match=message):
        PeersConfig(directory=Path("/tmp"), **kw)


def test_another_models_geometry_is_synthetic_kv_of_its_size():
    cfg = PeersConfig(directory=Path("/tmp"), model="llama-3-8b", payload="synthetic")
    geo = cfg.geometry
    assert geo.bytes_per_token == 32 * 2 * 8 * 128 * 2 and geo.chunk_bytes == 256 * 131072
    assert cfg.prefix_chunks == 128


def test_each_round_starts_one_system_later():
    assert turned(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert turned(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert turned([], 3) == []


def test_a_codec_twin_lives_apart_from_the_tier_it_twins():
    slab = twin_url("slab:///data/kv/kvtier-slab?size=1GiB", "raw")
    assert slab.startswith("slab:///data/kv/kvtier-slab-raw?") and "codec=raw" in slab
    redis = twin_url("redis://127.0.0.1:6379/0?timeout=30", "raw", "capacity")
    assert "prefix=kvtier-raw-capacity" in redis and "codec=raw" in redis
    assert "codec=kv" in twin_url("memory://?size=1GiB", "kv")


def test_a_chunk_that_differs_in_any_byte_is_found():
    kv = np.arange(4 * 1024, dtype=np.uint32).view(np.uint8)[: 4 * 2048].copy()
    prompt = Prompt(1, np.zeros(4 * 256, np.uint32), kv, 256)
    out = kv.copy()
    assert bad_chunks(prompt, out) == []
    out[2 * 2048 + 7] ^= 1
    assert bad_chunks(prompt, out) == [2]


def _result(name, tier, side, retrieve, store_gbps, per_token=None, coded=None):
    r = SystemResult(name, tier, side, "")
    r.latency["prefix"] = {"retrieve": LatencyStats(3, retrieve, retrieve, retrieve, retrieve, 1)}
    r.throughput = [{"depth": 1, "op": op, "gbps": store_gbps} for op in ("store", "retrieve")]
    r.bytes_per_token = per_token
    if coded:
        r.codec_bytes_per_token = {"kv": coded}
    r.chunks_checked = 1
    return r


def test_targets_hold_kvtier_against_the_peer_of_its_tier_class():
    cfg = PeersConfig(directory=Path("/tmp"), payload="synthetic", depths=(1,))
    report = PeersReport(cfg)
    report.results = [
        _result("kvtier redis://", "redis", "kvtier", 0.5, 2.0, 16000, 16000),
        _result("LMCache redis", "redis", "peer", 1.0, 1.0, 23040),
        _result("kvtier mooncake://", "mooncake", "kvtier", 0.5, 0.7),
        _result("Mooncake client", "mooncake", "peer", 0.5, 1.0),
        _result("kvtier memory://", "host memory", "kvtier", 0.5, 1.0),  # its peer failed
    ]
    cells = {(t.tier_class, t.what): t for t in targets(report)}
    assert cells[("redis", "32,768-token prefix retrieve p50 (cold)")].ratio == 0.5
    assert cells[("redis", "store GB/s at 1 in flight")].met is True
    capacity = cells[("redis", "bytes per token, peer ÷ kvtier (codec=kv)")]
    assert capacity.ratio == pytest.approx(1.44) and capacity.met is True
    assert cells[("mooncake", "retrieve GB/s at 1 in flight")].met is False  # 0.7× < 0.8×
    assert not any(t.tier_class == "host memory" for t in targets(report))
    assert passed(report) is False
