"""The engine's decision hook: LoadOrRecompute with queued seconds, and its log entries."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from kvtier.cache import CacheConfig, TieredCache
from kvtier.codec import BlockMeta
from kvtier.codec.container import RAW_META
from kvtier.cost.calibration import MeasuredCompute, PrefillFit
from kvtier.cost.transfer import TransferPath
from kvtier.job.decision import (
    TIE_FRACTION,
    LoggedDecision,
    QueueProbe,
    decision_entry,
    judge,
)
from kvtier.keys import Namespace
from kvtier.policy.decision import LoadOrRecompute
from kvtier.tiers.memory import MemoryTier

CHUNK = 16
KV_BYTES = 1000  # per token
COMPUTE = MeasuredCompute(PrefillFit(a=0.0, b=1e-3, c=0.0))  # 1 ms per token
PATHS = {
    "dram": TransferPath("dram", latency_s=1e-5, read_bandwidth=1e10),
    "disk": TransferPath("disk", latency_s=1e-3, read_bandwidth=1e9),
}


def _query(prompt: int, tiers: list[str]):
    usable = min(len(tiers), (prompt - 1) // CHUNK)
    return SimpleNamespace(prompt_tokens=prompt, tier_names=tiers, usable_chunks=usable)


def test_decision_loads_when_the_tier_is_idle_and_recomputes_behind_a_long_queue():
    policy = LoadOrRecompute(COMPUTE, KV_BYTES, PATHS, CHUNK)
    queue: dict[str, float] = {}
    decide = LoggedDecision(policy, lambda: queue)
    tiers = ["dram"] * 2 + ["disk"] * 6

    assert decide(_query(160, tiers)) == 8
    decision, queued, usable = decide.take()
    assert decision.action == "load" and queued == {} and usable == 8
    assert decide.take() is None  # taken once

    queue["disk"] = 10.0  # ten seconds of writes ahead on the disk: only the DRAM part pays
    assert decide(_query(160, tiers)) == 2
    decision, queued, _ = decide.take()
    assert decision.action == "partial" and queued == {"disk": 10.0}
    assert decision.predicted_s < decision.predicted_recompute_s

    queue["dram"] = 10.0
    assert decide(_query(160, tiers)) == 0
    assert decide.take()[0].action == "recompute"


class _GatedMemoryTier(MemoryTier):
    """A memory tier whose writes wait for a gate: the cache's write queue backs up."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.gate = threading.Event()

    def put(self, key, payload, meta=RAW_META):
        self.gate.wait(30)
        return super().put(key, payload, meta)


def test_queue_probe_reads_the_cache_write_queue():
    ns = Namespace("m", "f", "bf16", 1, 1, 1)
    tier = _GatedMemoryTier(ns.id, 1 << 22, name="dram")
    cache = TieredCache([tier], CacheConfig(chunk_tokens=CHUNK, write_batch=1, queue_chunks=8))
    chunk_bytes = CHUNK * KV_BYTES
    probe = QueueProbe(cache, {"dram": PATHS["dram"]}, chunk_bytes)
    try:
        assert probe() == {}
        keys = [bytes([i]) * 16 for i in range(4)]
        payloads = [np.full(chunk_bytes, i, np.uint8) for i in range(4)]
        cache.store(keys, payloads, BlockMeta("u8", (chunk_bytes,)))
        for _ in range(200):  # the writer takes one job and blocks on the gate
            if probe.depths()["dram"] == 3:
                break
            threading.Event().wait(0.01)
        assert probe.depths() == {"dram": 3}
        assert probe() == {"dram": pytest.approx(PATHS["dram"].seconds(3 * chunk_bytes))}
    finally:
        tier.gate.set()
        cache.close()
        tier.close()
    assert probe.depths() == {"dram": 0}


def _record(**kw):
    base = dict(prompt_tokens=100, hit_chunks=0, load_s=0.0, prefill_s=0.1)
    base.update(kw)
    return SimpleNamespace(**base)


def test_entries_pair_predictions_with_measurements():
    miss = decision_entry(_record(load_s=0.0, prefill_s=0.12), None, COMPUTE)
    assert miss.action == "miss" and miss.predicted_s == pytest.approx(0.1)
    assert miss.actual_s == pytest.approx(0.12) and miss.error == pytest.approx(0.1 / 0.12 - 1)
    judge(miss, 0.12, 0.12)
    assert miss.faster is None  # a miss has no alternative

    policy = LoadOrRecompute(COMPUTE, KV_BYTES, PATHS, CHUNK)
    made = (policy.decide(100, ["dram"] * 6), {}, 6)
    entry = decision_entry(_record(hit_chunks=6, load_s=0.001, prefill_s=0.005), made, COMPUTE)
    assert entry.action == "load" and entry.load_chunks == 6
    assert entry.predicted_prefill_s == pytest.approx(COMPUTE.prefill_seconds(4, 96))
    judge(entry, chosen_ttft_s=0.007, recompute_ttft_s=0.1)
    assert entry.faster is True and entry.alternative_s == 0.1
    slow = decision_entry(_record(hit_chunks=6, load_s=0.2, prefill_s=0.005), made, COMPUTE)
    judge(slow, chosen_ttft_s=0.21, recompute_ttft_s=0.1)
    assert slow.faster is False
    tie = decision_entry(_record(hit_chunks=6), made, COMPUTE)
    judge(tie, chosen_ttft_s=0.1 * (1 + TIE_FRACTION / 2), recompute_ttft_s=0.1)
    assert tie.faster is True  # within noise of the recompute: a tie counts as right
    doc = entry.as_dict()
    assert doc["predicted_s"] == pytest.approx(entry.predicted_s) and doc["tiers"] == ["dram"]
