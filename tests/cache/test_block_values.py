"""Seconds-of-prefill values reach cost-aware eviction, through stores, promotions and headers."""

from __future__ import annotations

import pytest

from kvtier.cache import CacheConfig, TieredCache
from kvtier.codec import BlockMeta
from kvtier.codec.container import pack_block, parse_header
from kvtier.testing.cache_conformance import (
    CHUNK_BYTES,
    META,
    NAMESPACE,
    buffers,
    chunk_keys,
    kv_chunk,
)
from kvtier.tiers.registry import open_tier

SLOT = -(-(CHUNK_BYTES + 128) // 4096) * 4096


def test_value_travels_in_the_header():
    header, _ = pack_block(NAMESPACE.id, b"k" * 16, b"abc", BlockMeta("u8", (3,), value=1.25))
    assert parse_header(header).meta.value == 1.25


def test_negative_or_nan_value_is_refused():
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="non-negative"):
            BlockMeta(value=bad)


def test_cost_aware_memory_tier_keeps_the_valuable_chunks():
    # A tier of 4 slots gets 8 chunks; the odd ones save 100x more prefill than the even ones.
    tier = open_tier(f"memory://?size={4 * SLOT}&eviction=cost", NAMESPACE.id)
    keys = chunk_keys(8)
    values = [100.0 if i % 2 else 1.0 for i in range(8)]
    with TieredCache([tier], CacheConfig(chunk_tokens=16)) as cache:
        cache.store(keys, [kv_chunk(k) for k in keys], META, values=values)
        assert cache.flush(timeout=30)
        kept = [tier.contains(k) for k in keys]
    assert kept == [False, True] * 4


def test_promotion_keeps_the_value(memory_tier, disk_tier):
    fast, slow = memory_tier(8), disk_tier(8)
    keys = chunk_keys(2)
    for i, key in enumerate(keys):
        assert slow.put(key, kv_chunk(key), BlockMeta(META.dtype, META.shape, value=2.0 + i))
    with TieredCache([fast, slow], CacheConfig(chunk_tokens=16)) as cache:
        assert cache.load(keys, buffers(2)).loaded == 2
        assert cache.flush(timeout=30)
    outs = buffers(2)
    assert [fast.get_into(k, o).meta.value for k, o in zip(keys, outs, strict=True)] == [2.0, 3.0]


def test_store_checks_the_number_of_values(memory_tier):
    keys = chunk_keys(2)
    with (
        TieredCache([memory_tier(4)], CacheConfig(chunk_tokens=16)) as cache,
        pytest.raises(ValueError, match="values"),
    ):
        cache.store(keys, [kv_chunk(k) for k in keys], META, values=[1.0])
