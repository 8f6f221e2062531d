"""The reuse-hint store and the cache's hinted admission of slow tiers."""

from __future__ import annotations

import numpy as np

from kvtier.cache import CacheConfig, TieredCache, TierOptions
from kvtier.cache.hints import ReuseHints
from kvtier.codec import BlockMeta
from kvtier.keys import Namespace
from kvtier.policy.reuse import ChunkValue, HintedAdmission, chunk_values
from kvtier.tiers.memory import MemoryTier

CHUNK = 16


def prefill(new: int, cached: int) -> float:
    return 1e-3 * new + 1e-6 * new * cached


def test_hints_are_bounded():
    hints = ReuseHints(window=2)
    hints.set([b"a", b"b", b"c"], [ChunkValue("chat", 1.0, 1.0)] * 3)
    assert hints.get(b"a") is None and hints.get(b"c") is not None


def test_cache_keeps_unique_tails_off_the_slow_tier_only():
    ns = Namespace("m", "f", "bf16", 1, 1, 1)
    fast = MemoryTier(ns.id, 1 << 22, name="dram")
    slow = MemoryTier(ns.id, 1 << 22, name="disk")
    hints = ReuseHints()
    adm = HintedAdmission(hints, store_s_per_byte=1e-9)
    cache = TieredCache(
        [fast, slow],
        CacheConfig(chunk_tokens=CHUNK, tiers=(TierOptions(), TierOptions(admission=adm))),
    )
    keys = [bytes([i]) * 16 for i in range(4)]
    hints.set(keys, chunk_values("rag", 2 * CHUNK, 4, CHUNK, prefill, 1e-5))
    payloads = [np.full(4096, i, np.uint8) for i in range(4)]
    try:
        cache.store(keys, payloads, BlockMeta("u8", (4096,)))
        assert cache.flush(timeout=30)
        assert fast.contains_many(keys) == [True] * 4
        assert slow.contains_many(keys) == [True, True, False, False]
        tiers = cache.metrics.as_dict()["tiers"]
        assert tiers["disk"]["not_admitted"] == 2 and tiers["dram"]["not_admitted"] == 0
    finally:
        cache.close()
        fast.close()
        slow.close()


def test_value_at_reads_the_last_prompt_set():
    hints = ReuseHints()
    assert hints.value_at(0) == 0.0
    hints.set([b"a", b"b"], [ChunkValue("shared", 2.0, 0.5), ChunkValue("rag", 0.0, 0.5)])
    assert [hints.value_at(i) for i in range(3)] == [1.0, 0.0, 0.0]
    hints.set([b"c"], [ChunkValue("chat", 1.0, -0.1)])  # a reload slower than the prefill
    assert hints.value_at(0) == 0.0 and hints.value_at(1) == 0.0
