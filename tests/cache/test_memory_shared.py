"""The cache scenarios with a shared tier (a real Redis, a real S3 server) behind host memory."""

from __future__ import annotations

import itertools

import pytest

from kvtier.testing.cache_conformance import NAMESPACE, CacheConformance
from kvtier.tiers.registry import open_tier

pytestmark = pytest.mark.services
_fresh = itertools.count()


def _shared_factory(url_of, tmp_path):
    opened = []

    def make(chunks: int = 1024, name: str = "shared"):
        prefix = f"c{tmp_path.name}-{next(_fresh)}"
        tier = open_tier(url_of(prefix, name), NAMESPACE.id)
        opened.append(tier)
        return tier

    return make, opened


@pytest.fixture
def redis_tier(redis_server, tmp_path):
    """Factory of Redis tiers, each under a key prefix of its own on the session's server."""
    make, opened = _shared_factory(
        lambda prefix, name: f"{redis_server.url}?prefix={prefix}&name={name}&timeout=1", tmp_path
    )
    yield make
    for tier in opened:
        tier.close()


@pytest.fixture
def s3_tier(s3_env, tmp_path):
    """Factory of S3 tiers, each under a prefix of its own in one bucket of the session's server."""
    make, opened = _shared_factory(
        lambda prefix, name: (
            f"s3://kvtier-cache/{prefix}?endpoint={s3_env.endpoint}&create=1&timeout=1&name={name}"
        ),
        tmp_path,
    )
    yield make
    for tier in opened:
        tier.close()


class TestMemoryOverRedis(CacheConformance):
    @pytest.fixture
    def fast_tier(self, memory_tier):
        return memory_tier

    @pytest.fixture
    def slow_tier(self, redis_tier):
        return redis_tier


class TestMemoryOverS3(CacheConformance):
    @pytest.fixture
    def fast_tier(self, memory_tier):
        return memory_tier

    @pytest.fixture
    def slow_tier(self, s3_tier):
        return s3_tier


def test_dram_and_disk_in_front_of_redis_fall_through_to_the_next_copy(
    memory_tier, disk_tier, redis_tier
):
    """A chunk evicted from host memory and corrupted on disk is served by the shared tier."""
    import numpy as np

    from kvtier.cache import CacheConfig, TieredCache
    from kvtier.testing.cache_conformance import CHUNK_TOKENS, META, chunk_keys, kv_chunk

    memory, disk, shared = memory_tier(2, "dram"), disk_tier(64, "disk"), redis_tier(64)
    cache = TieredCache([memory, disk, shared], CacheConfig(chunk_tokens=CHUNK_TOKENS))
    try:
        keys = chunk_keys(4)
        cache.store(keys, [kv_chunk(k) for k in keys], META)
        assert cache.flush(timeout=30)
        assert memory.contains_many(keys[:2]) == [False, False]  # evicted: room for 2 only
        victim = keys[0]
        path = next(p for p in disk.directory.rglob("*") if p.is_file() and victim.hex() in p.name)
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        found = cache.lookup(keys)
        assert found.tier_names[:2] == ["disk", "disk"]
        outs = [np.zeros_like(kv_chunk(k)) for k in keys]
        result = cache.load(keys, outs, found)
        assert result.loaded == 4 and result.corrupt == 1
        assert result.tiers[0] == 2  # the corrupt disk copy was replaced by the shared one
        for key, out in zip(keys, outs, strict=True):
            assert np.array_equal(out, kv_chunk(key))
    finally:
        cache.close()


def test_a_cache_of_one_shared_tier_loads_without_asking_first(redis_tier):
    """Its read answers as a lookup would: no ``contains_many`` round trip before it, and the
    first chunk the server lacks ends the load as not found."""
    import numpy as np

    from kvtier.cache import CacheConfig, TieredCache
    from kvtier.testing.cache_conformance import CHUNK_TOKENS, META, chunk_keys, kv_chunk

    shared = redis_tier(64)
    cache = TieredCache([shared], CacheConfig(chunk_tokens=CHUNK_TOKENS))
    try:
        keys = chunk_keys(4)
        cache.store(keys[:3], [kv_chunk(k) for k in keys[:3]], META)
        assert cache.flush(timeout=30)
        asked: list[int] = []
        inner = shared.contains_many
        shared.contains_many = lambda ks: asked.append(len(ks)) or inner(ks)
        outs = [np.zeros_like(kv_chunk(k)) for k in keys]
        result = cache.load(keys, outs)
        assert (result.loaded, result.located, result.errors, result.corrupt) == (3, 3, 0, 0)
        assert asked == []
        for key, out in zip(keys[:3], outs[:3], strict=True):
            assert np.array_equal(out, kv_chunk(key))
        assert not outs[3].any()
    finally:
        cache.close()
