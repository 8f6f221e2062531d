"""TieredCache behaviour tied to the real memory and disk tiers: bad blocks on disk, a long
lookup, buffers and payload ownership, and the cache's life cycle."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from kvtier.cache import LookupTiming, TieredCache, time_lookup
from kvtier.codec import BufferTooSmallError
from kvtier.errors import ConfigError
from kvtier.testing.cache_conformance import (
    CHUNK_BYTES,
    META,
    assert_loaded,
    buffers,
    chunk_keys,
    kv_chunk,
    store_all,
)

PAGE = 4096


def block_file(tier, key: bytes) -> str:
    """Where the disk tier keeps a block (its documented layout)."""
    return os.path.join(tier.root, key.hex()[:2], f"{key.hex()}.kvb")


def flip_payload_byte(tier, key: bytes, offset: int = 100) -> None:
    with open(block_file(tier, key), "r+b") as f:
        f.seek(PAGE + offset)
        byte = f.read(1)
        f.seek(PAGE + offset)
        f.write(bytes([byte[0] ^ 0xFF]))


# --- bad blocks ------------------------------------------------------------------------------
def test_a_corrupt_block_is_a_counted_miss_and_is_deleted(disk_tier, make_cache):
    disk = disk_tier(64, "disk")
    cache = make_cache([disk])
    keys = chunk_keys(4)
    store_all(cache, keys)
    # a bit rots in chunk 2's file
    flip_payload_byte(disk, keys[2])
    found = cache.lookup(keys)
    assert found.hit_chunks == 4  # lookup does not read blocks
    outs = buffers(4)
    result = cache.load(keys, outs, found)
    assert result.loaded == 2 and result.corrupt == 1  # stops at the bad block, never serves it
    assert_loaded(keys, outs, 2)
    assert cache.metrics.as_dict()["tiers"]["disk"]["corrupt_blocks"] == 1
    assert cache.flush(timeout=30)
    assert not disk.contains(keys[2]) and not os.path.exists(block_file(disk, keys[2]))
    # the next request sees a clean miss at chunk 2 and recomputes from there
    assert cache.lookup(keys).hit_chunks == 2


@pytest.mark.parametrize("damage", ["truncate", "other-key"])
def test_truncated_or_foreign_blocks_are_bad_blocks_too(disk_tier, make_cache, damage):
    disk = disk_tier(64, "disk")
    cache = make_cache([disk])
    keys = chunk_keys(2)
    store_all(cache, keys)
    if damage == "truncate":
        with open(block_file(disk, keys[0]), "r+b") as f:
            f.truncate(PAGE)
    else:  # another key's block copied under this key's name
        with open(block_file(disk, keys[1]), "rb") as f:
            other = f.read()
        with open(block_file(disk, keys[0]), "wb") as f:
            f.write(other)
    result = cache.load(keys, buffers(2))
    assert result.loaded == 0 and result.corrupt == 1
    assert cache.metrics.as_dict()["tiers"]["disk"]["corrupt_blocks"] == 1


def test_a_bad_block_falls_back_to_a_slower_tier_holding_a_good_copy(disk_tier, make_cache):
    near, far = disk_tier(64, "near"), disk_tier(64, "far")
    cache = make_cache([near, far])  # write-through: both hold every chunk
    keys = chunk_keys(3)
    store_all(cache, keys)
    flip_payload_byte(near, keys[1])
    outs = buffers(3)
    result = cache.load(keys, outs)
    assert result.loaded == 3 and result.corrupt == 1
    assert result.tiers == [0, 1, 0]
    assert_loaded(keys, outs, 3)
    assert cache.flush(timeout=30)
    # the bad copy was deleted, then the good one promoted back into the near tier
    assert cache.lookup(keys).tier_names == ["near", "near", "near"]
    assert cache.load(keys, buffers(3)).corrupt == 0


# --- loads where another lookup found the chunks ----------------------------------------------
def _counting_contains(tier) -> list[int]:
    calls: list[int] = []
    inner = tier.contains_many

    def contains_many(keys):
        calls.append(len(keys))
        return inner(keys)

    tier.contains_many = contains_many
    return calls


def test_a_load_told_where_each_chunk_is_reads_there_without_locating(
    memory_tier, disk_tier, make_cache
):
    near, far = memory_tier(64, "near"), disk_tier(64, "far")
    cache = make_cache([near, far])
    keys = chunk_keys(4)
    store_all(cache, keys)
    near.delete(keys[2])  # evicted from the tier the lookup named: the slower one has it
    calls = [_counting_contains(t) for t in (near, far)]
    outs = buffers(4)
    result = cache.load(keys, outs, promised=True, where=[0, 0, 0, 1])
    assert result.loaded == 4 and result.tiers == [0, 0, 1, 1]
    assert_loaded(keys, outs, 4)
    # no lookup (one contains_many of the four keys per tier); at most the promotion of the two
    # chunks the slower tier served asks the faster one
    assert calls[1] == [] and all(n <= 2 for n in calls[0])
    assert result.located == 4


def test_a_chunk_no_tier_has_ends_a_told_load_as_not_found(memory_tier, disk_tier, make_cache):
    near, far = memory_tier(64, "near"), disk_tier(64, "far")
    cache = make_cache([near, far])
    keys = chunk_keys(4)
    store_all(cache, keys[:2])
    result = cache.load(keys, buffers(4), where=[0, 0, 0, 0])
    assert (result.loaded, result.located, result.errors, result.corrupt) == (2, 2, 0, 0)
    # a wrong or short answer is not trusted: the cache locates the chunks itself
    calls = _counting_contains(near)
    assert cache.load(keys, buffers(4), where=[0, 5, 0, 0]).loaded == 2
    assert cache.load(keys, buffers(4), where=[0]).loaded == 2
    assert len(calls) == 2


# --- the long lookup -------------------------------------------------------------------------
def test_lookup_of_512_chunks_over_memory_and_disk(memory_tier, disk_tier, make_cache):
    """Correctness only; ``time_lookup`` (used by the bench) measures its speed."""
    memory, disk = memory_tier(512, "memory"), disk_tier(1024, "disk")
    cache = make_cache([memory, disk], tiers=("through", "none"))
    keys = chunk_keys(520)
    payload = kv_chunk(keys[0])
    # the first 300 chunks are in memory, 300..399 on disk only, 400 nowhere, 401.. on disk
    assert cache.store(keys[:300], [payload] * 300, META, copy=False) == 256  # queue bound
    cache.flush(timeout=30)
    cache.store(keys[256:300], [payload] * 44, META, copy=False)
    cache.flush(timeout=30)
    disk.put_many([(k, payload, META) for k in keys[300:400] + keys[401:]])
    found = cache.lookup(keys[:512])
    assert found.requested == 512 and found.hit_chunks == 400
    assert found.tiers == [0] * 300 + [1] * 100
    assert found.per_tier() == {"memory": 300, "disk": 100}
    assert cache.lookup(keys[401:]).hit_chunks == len(keys) - 401
    timing = time_lookup(cache, keys[:512], repeats=5, warmup=1)
    assert isinstance(timing, LookupTiming)
    assert timing.chunks == 512 and timing.hit_chunks == 400
    assert 0 < timing.min_s <= timing.median_s <= timing.p99_s
    assert len(timing.samples_s) == 5 and min(timing.samples_s) == timing.min_s
    tiers = cache.metrics.as_dict()["tiers"]
    assert tiers["memory"]["hits"] >= 300 and tiers["disk"]["hits"] >= 100


# --- buffers and ownership -------------------------------------------------------------------
def test_store_copies_so_the_engine_may_reuse_its_buffer_at_once(memory_tier, make_cache):
    cache = make_cache([memory_tier(16)])
    keys = chunk_keys(2)
    payloads = [kv_chunk(k) for k in keys]
    cache.store(keys, payloads, META)
    for p in payloads:
        p[...] = 0  # the engine overwrites its KV pages right after store returns
    assert cache.flush(timeout=30)
    outs = buffers(2)
    assert cache.load(keys, outs).loaded == 2
    assert_loaded(keys, outs, 2)


def test_load_fills_at_most_the_buffers_given(memory_tier, make_cache):
    cache = make_cache([memory_tier(16)])
    keys = chunk_keys(4)
    store_all(cache, keys)
    outs = buffers(2)
    assert cache.load(keys, outs).loaded == 2
    assert_loaded(keys, outs, 2)


def test_buffers_too_small_are_the_callers_bug_and_raise(memory_tier, make_cache):
    cache = make_cache([memory_tier(16)])
    keys = chunk_keys(1)
    store_all(cache, keys)
    with pytest.raises(BufferTooSmallError):
        cache.load(keys, [np.zeros(CHUNK_BYTES // 2, np.uint8)])


def test_store_checks_its_arguments(memory_tier, make_cache):
    cache = make_cache([memory_tier(16)])
    with pytest.raises(ValueError, match="payloads"):
        cache.store(chunk_keys(2), [kv_chunk(b"x" * 16)], META)
    assert cache.store([], [], META) == 0


# --- life cycle ------------------------------------------------------------------------------
def test_close_finishes_writes_unpins_and_is_idempotent(memory_tier, disk_tier):
    memory, disk = memory_tier(16), disk_tier(64)
    cache = TieredCache([memory, disk])
    keys = chunk_keys(3)
    cache.store(keys, [kv_chunk(k) for k in keys], META)
    cache.pin(keys, ttl_s=60)
    cache.close()
    assert disk.contains_many(keys) == [True] * 3  # queued writes were finished
    assert not memory.is_pinned(keys[0])  # the tiers no longer consult the cache's leases
    assert cache.store(keys, [kv_chunk(k) for k in keys], META) == 0
    assert cache.prefetch(keys).result(timeout=5).ready == 0
    cache.close()
    with TieredCache([memory]) as again:  # the tiers stay open for their owner
        assert again.lookup(keys).hit_chunks == 3


def test_tiers_with_the_same_name_get_distinct_metric_labels(memory_tier, make_cache):
    cache = make_cache([memory_tier(4, "memory"), memory_tier(8, "memory")])
    assert cache.names == ("memory", "memory#1")
    assert set(cache.metrics.as_dict()["tiers"]) >= {"memory", "memory#1"}
    assert "memory#1" in repr(cache)


def test_a_cache_needs_tiers_and_one_option_per_tier(memory_tier):
    with pytest.raises(ConfigError, match="at least one tier"):
        TieredCache([])
    from kvtier.cache import CacheConfig

    with pytest.raises(ConfigError, match="one per tier"):
        TieredCache([memory_tier(4)], CacheConfig(tiers=("through", "back")))


def test_pin_uses_the_default_ttl(memory_tier, make_cache):
    cache = make_cache([memory_tier(4)], lease_ttl_s=5)
    lease = cache.pin(chunk_keys(1))
    assert 4 < lease.expires_at - time.monotonic() <= 5


def test_evictions_reach_listeners_and_every_change_moves_the_epoch(memory_tier, make_cache):
    cache = make_cache([memory_tier(4, name="host")])
    evicted: list[tuple[str, bytes]] = []
    cache.add_eviction_listener(lambda tier, key: evicted.append((tier, key)))
    start = cache.epoch
    keys = chunk_keys(6)
    store_all(cache, keys[:4])
    after_stores = cache.epoch
    assert after_stores > start and evicted == []
    store_all(cache, keys[4:])  # a tier of four chunks: two of the first ones leave
    assert sorted(evicted) == sorted(("host", k) for k in keys[:2])
    assert cache.epoch > after_stores
    still = cache.epoch
    cache.lookup(keys)  # a lookup changes nothing
    assert cache.epoch == still


def test_a_promised_load_refreshes_a_tier_that_lists_other_writers_lazily(tmp_path):
    """Another process stored chunks in a shared slab directory and a lookup elsewhere found
    them; this cache's own listing is younger than its rescan interval. A load told the
    chunks were promised finds them; one not told calls them missing until it looks again."""
    from kvtier.cache import CacheConfig
    from kvtier.testing.cache_conformance import CHUNK_TOKENS, NAMESPACE
    from kvtier.tiers import open_tier

    url = f"slab://{tmp_path}/shared?size=16MiB&rescan=60"
    writer_tier, reader_tier = open_tier(url, NAMESPACE.id), open_tier(url, NAMESPACE.id)
    writer = TieredCache([writer_tier], CacheConfig(chunk_tokens=CHUNK_TOKENS))
    reader = TieredCache([reader_tier], CacheConfig(chunk_tokens=CHUNK_TOKENS))
    try:
        keys = chunk_keys(3)
        assert reader.lookup(keys).hit_chunks == 0  # its listing is fresh now, for 60 s
        store_all(writer, keys)
        assert writer.flush(10)
        assert reader.load(keys, buffers(3)).loaded == 0  # not promised: a miss
        outs = buffers(3)
        result = reader.load(keys, outs, promised=True)
        assert result.loaded == 3
        assert_loaded(keys, outs, 3)
    finally:
        for cache, tier in ((writer, writer_tier), (reader, reader_tier)):
            cache.close()
            tier.close()
