"""The tier guard: a failing tier is counted once per outage, skipped, then used again; a bad
block is discarded; every change moves the epoch."""

from __future__ import annotations

import time

import pytest

from kvtier.cache.breaker import Breakers
from kvtier.cache.config import CacheConfig
from kvtier.cache.guard import DOWN, SKIPPED, TierGuard
from kvtier.cache.metrics import CacheMetrics
from kvtier.codec import BlockError, BlockHeader
from kvtier.testing.cache_conformance import CHUNK_TOKENS, META, buffers, chunk_keys, kv_chunk


def _guard(tiers, backoff_s: float = 0.05):
    names = [t.name for t in tiers]
    metrics = CacheMetrics(names, CHUNK_TOKENS, CacheConfig().latency_buckets)
    discarded: list[tuple[int, bytes]] = []
    guard = TierGuard(
        tiers,
        names,
        metrics,
        Breakers(len(tiers), backoff_s, 1.0),
        lambda t, k: discarded.append((t, k)),
    )
    return guard, metrics, discarded


def _unplug(tier, monkeypatch) -> None:
    """The tier's store goes away: every read raises as a dropped connection does."""

    def gone(*args, **kwargs):
        raise ConnectionError("connection reset by peer")

    monkeypatch.setattr(tier, "get_many_into", gone)
    monkeypatch.setattr(tier, "get_into", gone)


def test_a_read_of_a_failing_tier_opens_its_breaker_once_and_it_answers_again(
    memory_tier, monkeypatch
):
    tier = memory_tier(8)
    keys = chunk_keys(2)
    for key in keys:
        assert tier.put(key, kv_chunk(key), META)
    guard, metrics, _ = _guard([tier])
    before = guard.epoch
    with monkeypatch.context() as patch:
        _unplug(tier, patch)
        assert guard.read(0, keys, buffers(2)) == [DOWN, DOWN]
        assert not guard.up(0) and guard.epoch > before
        assert guard.read(0, keys, buffers(2)) == [SKIPPED, SKIPPED]  # not asked while open
        assert guard.down_gauge() == [(tier.name, 1.0)]
    counts = metrics.as_dict()["tiers"][tier.name]
    assert counts["tier_errors"] == 1 and counts["tier_outages"] == 1
    time.sleep(0.06)
    assert guard.up(0)
    results = guard.read(0, keys, buffers(2))
    assert all(isinstance(r, BlockHeader) for r in results)
    assert guard.down_gauge() == [(tier.name, 0.0)]


def test_read_below_serves_from_a_slower_tier_and_accounts_for_each_tier_passed(
    memory_tier, monkeypatch
):
    fast, middle, slow = memory_tier(8, "fast"), memory_tier(8, "middle"), memory_tier(8, "slow")
    key = chunk_keys(1)[0]
    assert slow.put(key, kv_chunk(key), META)
    guard, metrics, _ = _guard([fast, middle, slow])
    _unplug(middle, monkeypatch)
    t, header, corrupt, errors = guard.read_below(0, key, buffers(1)[0])
    assert (t, corrupt, errors) == (2, 0, 1) and isinstance(header, BlockHeader)
    assert metrics.as_dict()["tiers"]["middle"]["tier_errors"] == 1
    assert guard.read_below(2, key, buffers(1)[0]) == (-1, None, 0, 0)


def test_account_discards_a_bad_block_and_counts_a_miss(memory_tier):
    tier = memory_tier(8)
    guard, metrics, discarded = _guard([tier])
    key = chunk_keys(1)[0]
    assert guard.account(0, key, BlockError("checksum mismatch")) == (1, 0)
    assert discarded == [(0, key)]
    assert guard.account(0, key, None) == (0, 0)
    assert guard.account(0, key, DOWN) == (0, 1)
    counts = metrics.as_dict()["tiers"][tier.name]
    assert counts["corrupt_blocks"] == 1 and counts["load_misses"] == 1


@pytest.mark.parametrize("sizes", [[10, 4, 30], [0]])
def test_the_largest_block_seen_only_grows(memory_tier, sizes):
    guard, _, _ = _guard([memory_tier(8)])
    for n in sizes:
        guard.saw_block(n)
    assert guard.largest_block == max(sizes)
