"""Promotion and prefetch on real tiers, through a TieredCache that composes them."""

from __future__ import annotations

from kvtier.cache import CacheConfig, TieredCache
from kvtier.testing.cache_conformance import (
    CHUNK_TOKENS,
    META,
    assert_loaded,
    buffers,
    chunk_keys,
    kv_chunk,
)


def _disk_only_then_cache(memory_tier, disk_tier, keys, **config):
    fast, slow = memory_tier(16, "fast"), disk_tier(16, "slow")
    for key in keys:
        assert slow.put(key, kv_chunk(key), META)
    cache = TieredCache([fast, slow], CacheConfig(chunk_tokens=CHUNK_TOKENS, **config))
    return cache, fast


def test_a_load_from_the_slow_tier_promotes_into_the_fast_one(memory_tier, disk_tier):
    keys = chunk_keys(3)
    cache, fast = _disk_only_then_cache(memory_tier, disk_tier, keys)
    with cache:
        outs = buffers(3)
        assert cache.load(keys, outs).per_tier == {"slow": 3}
        assert_loaded(keys, outs, 3)
        assert cache.flush(timeout=30)
        assert all(fast.contains(k) for k in keys)
        assert cache.metrics.as_dict()["tiers"]["fast"]["promotions"] == 3
        assert cache.load(keys, buffers(3)).per_tier == {"fast": 3}


def test_a_prefetch_copies_the_hit_prefix_up_now_and_pins_it(memory_tier, disk_tier):
    keys = chunk_keys(4)
    cache, fast = _disk_only_then_cache(memory_tier, disk_tier, keys[:3], prefetch_pin_s=30)
    with cache:
        result = cache.prefetch(keys).result(timeout=30)
        assert (result.ready, result.promoted) == (3, 3)
        assert all(fast.contains(k) for k in keys[:3])
        assert all(cache.is_pinned(k) for k in keys[:3]) and not cache.is_pinned(keys[3])
        outs = buffers(3)
        assert cache.load(keys[:3], outs).per_tier == {"fast": 3}
        assert_loaded(keys, outs, 3)


def test_a_prefetch_after_close_does_nothing(memory_tier, disk_tier):
    keys = chunk_keys(2)
    cache, fast = _disk_only_then_cache(memory_tier, disk_tier, keys)
    cache.close()
    result = cache.prefetch(keys).result(timeout=5)
    assert (result.ready, result.promoted) == (0, 0)
    assert not any(fast.contains(k) for k in keys)
