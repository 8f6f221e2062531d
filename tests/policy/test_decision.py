"""The load-or-recompute decision picks the cut with the least predicted time."""

from dataclasses import dataclass

import pytest

from kvtier.errors import ConfigError
from kvtier.policy.decision import LoadOrRecompute


@dataclass
class LinearCompute:
    """Prefill cost a + b·new + c·new·(cached + new/2): the shape the roofline model has."""

    a: float = 0.01
    b: float = 1e-3
    c: float = 1e-8

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        return self.a + self.b * new + self.c * new * (cached + new / 2)


@dataclass
class Path:
    latency: float
    bandwidth: float

    def seconds(self, raw_bytes: float) -> float:
        return self.latency + raw_bytes / self.bandwidth


CHUNK = 256
KV = 1000.0  # bytes per token


def policy(**paths: Path) -> LoadOrRecompute:
    return LoadOrRecompute(LinearCompute(), KV, paths, CHUNK)


def test_fast_tier_loads_every_usable_chunk():
    d = policy(dram=Path(1e-5, 1e10)).decide(8 * CHUNK + 10, ["dram"] * 8)
    assert (d.action, d.load_chunks, d.load_tokens) == ("load", 8, 8 * CHUNK)
    assert d.predicted_s < d.predicted_recompute_s


def test_slow_tier_recomputes():
    d = policy(s3=Path(30.0, 1e6)).decide(8 * CHUNK + 10, ["s3"] * 8)
    assert (d.action, d.load_chunks) == ("recompute", 0)
    assert d.predicted_s == pytest.approx(d.predicted_recompute_s)


def test_mixed_tiers_load_only_the_part_that_pays():
    # Four chunks in DRAM, then four in a tier whose latency alone exceeds their prefill.
    p = policy(dram=Path(1e-5, 1e10), slow=Path(10.0, 1e10))
    d = p.decide(8 * CHUNK + 10, ["dram"] * 4 + ["slow"] * 4)
    assert (d.action, d.load_chunks, d.tiers) == ("partial", 4, ("dram",))


def test_whole_prompt_cached_still_computes_one_token():
    d = policy(dram=Path(1e-5, 1e10)).decide(4 * CHUNK, ["dram"] * 4)
    assert d.load_chunks == 3
    assert d.action == "load"


def test_an_engine_that_recomputes_the_last_token_may_load_every_chunk():
    d = policy(dram=Path(1e-5, 1e10)).decide(4 * CHUNK, ["dram"] * 4, usable=4)
    assert (d.action, d.load_chunks) == ("load", 4)
    assert d.predicted_prefill_s == pytest.approx(LinearCompute().prefill_seconds(1, 4 * CHUNK))


def test_queue_behind_inflight_loads_can_flip_to_recompute():
    p = policy(disk=Path(1e-4, 1e9))
    prompt, hits = 8 * CHUNK + 10, ["disk"] * 8
    assert p.decide(prompt, hits).action == "load"
    assert p.decide(prompt, hits, queued_s={"disk": 100.0}).action == "recompute"


def test_longer_prefix_never_loses_to_shorter_on_uniform_tier():
    p = policy(disk=Path(5e-3, 2e8))
    ratios = []
    for chunks in (1, 4, 16, 64):
        d = p.decide(chunks * CHUNK + 1, ["disk"] * chunks)
        ratios.append(d.predicted_recompute_s / d.predicted_s)
    assert ratios == sorted(ratios)


def test_unknown_tier_is_a_config_error():
    with pytest.raises(ConfigError, match="no transfer path"):
        policy(dram=Path(0, 1e9)).decide(3 * CHUNK, ["nvme"] * 2)
