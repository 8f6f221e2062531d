"""StagingPool: page-aligned buffers of one size, lent and taken back, and reused."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.cache import CacheConfig, StagingPool, TieredCache
from kvtier.testing.cache_conformance import CHUNK_TOKENS, META, chunk_keys, kv_chunk
from kvtier.tiers.io.buffers import PAGE, address


def test_buffers_are_aligned_of_one_size_and_reused_up_to_keep():
    pool = StagingPool(10_000, keep=2)
    bufs = pool.take(3)
    assert all(b.nbytes == 10_000 and b.dtype == np.uint8 for b in bufs)
    assert all(address(b) % PAGE == 0 for b in bufs)
    assert len({address(b) for b in bufs}) == 3
    for b in bufs:
        pool.give(b)
    assert pool.idle == 2  # the third is dropped
    again = pool.take(3)
    assert {address(b) for b in again[:2]} <= {address(b) for b in bufs}
    pool.give(np.empty(5, np.uint8))  # not one of its size: ignored
    pool.give(b"x" * 10_000)
    assert pool.idle == 0


def test_within_keeps_what_the_budget_holds_and_refuses_nonsense():
    assert StagingPool.within(1 << 20, 64 << 20).keep == 64
    assert StagingPool.within(1 << 30, 64 << 20).keep == 4
    with pytest.raises(ValueError):
        StagingPool(0, 1)


def test_a_cache_gives_stored_buffers_back_to_the_pool(memory_tier):
    tier = memory_tier(16)
    cache = TieredCache([tier], CacheConfig(chunk_tokens=CHUNK_TOKENS))
    keys = chunk_keys(4)
    first = kv_chunk(keys[0]).view(np.uint8).reshape(-1)
    pool = StagingPool(first.nbytes, keep=8)
    bufs = pool.take(len(keys))
    for k, b in zip(keys, bufs, strict=True):
        np.copyto(b, kv_chunk(k).view(np.uint8).reshape(-1))
    assert cache.store(keys, bufs, META, copy=False, release=pool.give) == 4
    assert cache.flush(30)
    assert pool.idle == 4
    out = np.empty(first.nbytes, np.uint8)
    for k in keys:  # what was stored is what the buffers held, though they are free again
        assert cache.load([k], [out]).loaded == 1
        assert out.tobytes() == kv_chunk(k).tobytes()
    cache.close()


def test_a_memory_first_cache_lends_its_slots_and_stores_each_chunk_in_place(
    memory_tier, disk_tier
):
    fast, slow = memory_tier(16, "fast"), disk_tier(16, "slow")
    cache = TieredCache([fast, slow], CacheConfig(chunk_tokens=CHUNK_TOKENS))
    assert cache.lender() is fast
    keys = chunk_keys(3)
    nbytes = kv_chunk(keys[0]).nbytes
    fast.put(keys[0], kv_chunk(keys[0]))  # sizes the slots
    fast.delete(keys[0])
    pool = StagingPool(nbytes, keep=4, lender=cache.lender())
    bufs = pool.take(3)
    assert all(b.ctypes.data % PAGE == 0 for b in bufs)
    for k, b in zip(keys, bufs, strict=True):
        np.copyto(b, kv_chunk(k).view(np.uint8).reshape(-1))
    assert cache.store(keys, bufs, META, copy=False, release=pool.give) == 3
    assert cache.flush(30)
    assert pool.idle == 0  # lent slots went back to the tier, not to the pool
    for k, b in zip(keys, bufs, strict=True):
        assert fast.block_views(k)[0].ctypes.data == b.ctypes.data - PAGE  # stored in place
        assert slow.contains(k)  # and written through from the same bytes
    out = np.empty(nbytes, np.uint8)
    assert cache.load(keys, [out] * 3).loaded == 3
    assert out.tobytes() == kv_chunk(keys[2]).tobytes()
    cache.close()


def test_only_a_raw_memory_tier_written_through_first_lends(memory_tier, disk_tier):
    slow = disk_tier(16, "slow")
    assert TieredCache([slow], CacheConfig(chunk_tokens=CHUNK_TOKENS)).lender() is None
    fast = memory_tier(16, "fast")
    back = TieredCache(
        [fast, slow],
        CacheConfig(chunk_tokens=CHUNK_TOKENS).with_tiers("none", "through"),
    )
    assert back.lender() is None
