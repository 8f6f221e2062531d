"""Host memory and a disk tier in front of a real Redis tier stay consistent: a block evicted
from memory is loaded from the disk tier, one corrupted on disk is a counted miss there and is
loaded from Redis, and what arrives is always what was stored."""

from __future__ import annotations

import pytest

from kvtier.cache import CacheConfig, TieredCache
from kvtier.testing.cache_conformance import (
    CHUNK_BYTES,
    META,
    NAMESPACE,
    chunk_keys,
    kv_chunk,
    load_checked,
)
from kvtier.tiers.io.buffers import PAGE
from kvtier.tiers.registry import open_tier

pytestmark = pytest.mark.services

CHUNKS = 4


def _flip_on_disk(slab, key: bytes) -> None:
    """Flip one payload bit of ``key``'s block in the slab file."""
    entry = slab._index[key]
    with open(entry.file.path, "r+b") as f:
        f.seek(entry.offset + PAGE + entry.header.stored_len // 2)
        byte = f.read(1)[0]
        f.seek(entry.offset + PAGE + entry.header.stored_len // 2)
        f.write(bytes([byte ^ 0x10]))


def _load(cache: TieredCache, keys) -> tuple[int, dict]:
    before = _hits(cache)
    loaded = load_checked(cache, keys)
    after = _hits(cache)
    return loaded, {n: after[n] - before[n] for n in after}


def _hits(cache: TieredCache) -> dict[str, int]:
    """Chunks each tier has read into buffers so far."""
    tiers = cache.metrics.as_dict()["tiers"]
    return {n: tiers[n]["reads"] for n in ("dram", "disk", "redis")}


def test_evicted_or_corrupted_blocks_come_from_the_next_tier(redis_server, tmp_path):
    memory = open_tier(f"memory://?size={8 * (CHUNK_BYTES + 4096)}&name=dram", NAMESPACE.id)
    slab = open_tier(f"slab://{tmp_path}/disk?size=64MiB&name=disk", NAMESPACE.id)
    redis = open_tier(f"{redis_server.url}?prefix=consist-{tmp_path.name}&name=redis", NAMESPACE.id)
    cache = TieredCache([memory, slab, redis], CacheConfig(chunk_tokens=16))
    keys = chunk_keys(CHUNKS, start=42_000)
    try:
        cache.store(keys, [kv_chunk(k) for k in keys], META)
        assert cache.flush(timeout=30)
        assert all(t.contains_many(keys) == [True] * CHUNKS for t in (memory, slab, redis))
        assert _load(cache, keys) == (CHUNKS, {"dram": CHUNKS, "disk": 0, "redis": 0})

        memory.delete_many(keys[:2])  # evicted from memory: the disk tier has them
        loaded, hits = _load(cache, keys)
        assert loaded == CHUNKS and hits["disk"] == 2 and hits["redis"] == 0
        assert cache.flush(timeout=30)

        memory.delete_many(keys)  # gone from memory, and one block torn on disk
        _flip_on_disk(slab, keys[1])
        loaded, hits = _load(cache, keys)
        assert loaded == CHUNKS
        assert hits["redis"] == 1  # the torn block, read again from the next tier
        assert cache.metrics.as_dict()["tiers"]["disk"]["corrupt_blocks"] == 1
    finally:
        cache.close()
        for tier in (memory, slab, redis):
            tier.close()
