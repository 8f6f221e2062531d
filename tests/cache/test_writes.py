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


def _lender(tiers):
    """A release callback recording, per payload, which tiers held its key when it came back."""
    back: list[tuple[int, tuple[bool, ...]]] = []

    def release(payload) -> None:
        key = payload.key
        back.append((id(payload), tuple(t.contains(key) for t in tiers)))

    return back, release


class _Lent(bytearray):
    """A payload that knows its key (so the release can look where it landed)."""

    key: bytes


def _lent(keys) -> list[_Lent]:
    out = []
    for k in keys:
        p = _Lent(kv_chunk(k).tobytes())
        p.key = k
        out.append(p)
    return out


def test_a_lent_payload_comes_back_once_after_every_tier_wrote_it(memory_tier, disk_tier):
    fast, slow = memory_tier(16, "fast"), disk_tier(16, "slow")
    writes, _, _ = _writes([fast, slow])
    keys = chunk_keys(5)
    payloads = _lent(keys)
    back, release = _lender([fast, slow])
    assert writes.store(keys, payloads, META, False, None, release) == 5
    assert writes.flush(timeout=30)
    assert sorted(i for i, _ in back) == sorted(id(p) for p in payloads)  # each once
    assert all(where == (True, True) for _, where in back)  # never before both wrote it
    writes.close(timeout=5)


def test_what_no_writer_takes_comes_back_at_once(memory_tier, disk_tier):
    fast, slow = memory_tier(64, "fast"), disk_tier(64, "slow")
    # the slow tier refuses the first sighting of every key; the fast one queues only 4
    writes, _, _ = _writes(
        [fast, slow],
        TierOptions(),
        TierOptions(admission=FrequencyAdmission(min_hits=2)),
        queue_chunks=4,
    )
    keys = chunk_keys(12)
    payloads = _lent(keys)
    back, release = _lender([fast, slow])
    taken = writes.store(keys, payloads, META, False, None, release)
    assert 0 < taken < len(keys)
    assert len(back) >= len(keys) - taken  # the untaken ones, before any writer ran
    assert writes.flush(timeout=30)
    assert sorted(i for i, _ in back) == sorted(id(p) for p in payloads)
    written = {id(p) for p in payloads[:taken]}
    assert all(where[0] for i, where in back if i in written)
    assert not any(where[1] for _, where in back)  # the slow tier admitted none of them
    writes.close(timeout=5)


def test_copied_or_refused_payloads_come_back_at_once(memory_tier):
    tier = memory_tier(16)
    writes, _, _ = _writes([tier])
    keys = chunk_keys(3)
    copied = _lent(keys)
    back, release = _lender([tier])
    assert writes.store(keys, copied, META, True, None, release) == 3
    assert sorted(i for i, _ in back) == sorted(id(p) for p in copied)  # copied: theirs again
    assert writes.flush(timeout=30) and all(tier.contains(k) for k in keys)
    writes.close(timeout=5)
    back.clear()
    late = _lent(keys)
    assert writes.store(keys, late, META, False, None, release) == 0
    assert sorted(i for i, _ in back) == sorted(id(p) for p in late)
