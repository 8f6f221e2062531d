"""Real tiers for the cache tests: factories of memory and disk tiers sized in chunks."""

from __future__ import annotations

import pytest

from kvtier.testing.cache_conformance import CHUNK_BYTES, NAMESPACE
from kvtier.tiers.registry import open_tier


@pytest.fixture
def memory_tier():
    """Factory of real memory tiers holding ``chunks`` chunks (one 4 KiB-rounded slot each)."""
    opened = []
    slot = -(-(CHUNK_BYTES + 128) // 4096) * 4096

    def make(chunks: int = 64, name: str = "memory"):
        tier = open_tier(f"memory://?size={chunks * slot}", NAMESPACE.id)
        tier.name = name
        opened.append(tier)
        return tier

    yield make
    for tier in opened:
        tier.close()


@pytest.fixture
def disk_tier(tmp_path):
    """Factory of real disk tiers, each in a fresh directory, holding about ``chunks`` chunks."""
    opened = []

    def make(chunks: int = 1024, name: str = "disk"):
        root = tmp_path / f"{name}-{len(opened)}"
        size = chunks * (CHUNK_BYTES + 4096)  # a 4 KiB header page per block file
        tier = open_tier(f"file://{root}?size={size}&sync=0", NAMESPACE.id)
        tier.name = name
        opened.append(tier)
        return tier

    yield make
    for tier in opened:
        tier.close()


@pytest.fixture
def make_cache():
    """Factory of TieredCaches, closed after the test."""
    from kvtier.cache import CacheConfig, TieredCache
    from kvtier.testing.cache_conformance import CHUNK_TOKENS

    caches = []

    def make(stack, **config):
        config.setdefault("chunk_tokens", CHUNK_TOKENS)
        cache = TieredCache(stack, CacheConfig(**config))
        caches.append(cache)
        return cache

    yield make
    for cache in caches:
        cache.close(timeout=10)
