"""The write side on real tiers: stores reach every write-through tier, admission and full or
skipped tiers drop and count, spills reach the write-back tier, nothing is taken after close."""

from __future__ import annotations

from kvtier.cache.breaker import Breakers
from kvtier.cache.config import CacheConfig, TierOptions
from kvtier.cache.guard import TierGuard
from kvtier.cache.metrics import CacheMetrics
from kvtier.cache.writes import Writes
from kvtier.policy.admission import FrequencyAdmission
from kvtier.testing.cache_conformance import CHUNK_TOKENS, META, chunk_keys, kv_chunk


def _writes(tiers, *opts: TierOptions, **config):
    names = [t.name for t in tiers]
    cfg = CacheConfig(chunk_tokens=CHUNK_TOKENS, **config)
    metrics = CacheMetrics(names, CHUNK_TOKENS, cfg.latency_buckets)
    holder: list[Writes] = []
    guard = TierGuard(
        tiers, names, metrics, Breakers(len(tiers), 1.0, 1.0), lambda t, k: holder[0].discard(t, k)
    )
    writes = Writes(guard, opts or (TierOptions(),) * len(tiers), cfg)
    holder.append(writes)
    return writes, guard, metrics


def test_a_store_reaches_every_write_through_tier_and_moves_the_epoch(memory_tier, disk_tier):
    fast, slow = memory_tier(16, "fast"), disk_tier(16, "slow")
    writes, guard, metrics = _writes([fast, slow])
    keys = chunk_keys(3)
    before = guard.epoch
    assert writes.store(keys, [kv_chunk(k) for k in keys], META, True, None) == 3
    assert writes.flush(timeout=30)
    assert all(fast.contains(k) and slow.contains(k) for k in keys)
    assert guard.epoch > before and guard.largest_block == kv_chunk(keys[0]).nbytes
    assert metrics.as_dict()["tiers"]["slow"]["writes"] == 3
    writes.close(timeout=5)


def test_admission_filters_stores_and_counts_what_it_refuses(memory_tier):
    tier = memory_tier(16)
    writes, _, metrics = _writes([tier], TierOptions(admission=FrequencyAdmission(min_hits=2)))
    keys = chunk_keys(2)
    writes.store(keys, [kv_chunk(k) for k in keys], META, True, None)
    assert writes.flush(timeout=30)
    assert not any(tier.contains(k) for k in keys)
    assert metrics.as_dict()["tiers"][tier.name]["not_admitted"] == 2
    writes.store(keys, [kv_chunk(k) for k in keys], META, True, None)  # seen twice: admitted
    assert writes.flush(timeout=30)
    assert all(tier.contains(k) for k in keys)
    writes.close(timeout=5)


def test_a_full_queue_drops_and_counts(memory_tier):
    tier = memory_tier(64)
    writes, _, metrics = _writes([tier], queue_chunks=4)
    keys = chunk_keys(40)
    taken = writes.store(keys, [kv_chunk(k) for k in keys], META, True, None)
    assert taken < len(keys)
    assert writes.flush(timeout=30)
    assert metrics.as_dict()["tiers"][tier.name]["dropped_writes"] == len(keys) - taken
    writes.close(timeout=5)


def test_a_spill_reaches_the_write_back_tier(memory_tier, disk_tier):
    fast, slow = memory_tier(4, "fast"), disk_tier(16, "slow")
    writes, _, metrics = _writes([fast, slow], TierOptions(), TierOptions(write="back"))
    key = chunk_keys(1)[0]
    writes.spill(1, key, memoryview(kv_chunk(key)).cast("B"), META)
    assert writes.flush(timeout=30)
    assert slow.contains(key) and not fast.contains(key)
    assert metrics.as_dict()["tiers"]["slow"]["write_backs"] == 1
    writes.close(timeout=5)


def test_a_closed_write_side_takes_nothing(memory_tier):
    tier = memory_tier(16)
    writes, _, _ = _writes([tier])
    writes.close(timeout=5)
    keys = chunk_keys(2)
    assert writes.closed
    assert writes.store(keys, [kv_chunk(k) for k in keys], META, True, None) == 0
    assert writes.enqueue(0, []) == 0
    assert not any(tier.contains(k) for k in keys)


def test_write_listeners_hear_what_landed_in_each_tier_and_what_was_deleted(memory_tier, disk_tier):
    fast, slow = memory_tier(16, "fast"), disk_tier(16, "slow")
    writes, _guard, _metrics = _writes([fast, slow])
    heard: list[tuple[int, list[bytes], list[bytes]]] = []
    writes.listeners.append(lambda t, stored, deleted: heard.append((t, stored, deleted)))
    keys = chunk_keys(2)
    writes.store(keys, [kv_chunk(k) for k in keys], META, True, None)
    assert writes.flush(timeout=30)
    assert sorted(k for t, stored, _ in heard if t == 1 for k in stored) == sorted(keys)
    assert sorted(k for t, stored, _ in heard if t == 0 for k in stored) == sorted(keys)
    heard.clear()
    writes.discard(1, keys[0])
    writes.discard(1, b"\x09" * 16)  # never stored: not heard as deleted
    assert writes.flush(timeout=30)
    assert heard == [(1, [], [keys[0]])]
    writes.close(timeout=5)
