"""Scenarios every (fast tier, slow tier) pair must pass under a TieredCache, plus helpers.

Use: subclass :class:`CacheConformance` in a test module as ``TestMyTiers`` and give it two
fixtures, ``fast_tier`` and ``slow_tier``: factories ``(chunks: int, name: str) -> Tier`` that
open a fresh, real tier able to hold about ``chunks`` chunks of :data:`CHUNK_BYTES`. The fast tier
must evict (and spill to listeners) when full and honour pins.

The wrappers :class:`SlowTier` and :class:`DeadTier` pass every verb to a real tier and add
delay or failure: they stand in for a throttled device or a dropped link, so that the cache's
handling of those is what the test exercises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

from kvtier.cache import CacheConfig, TieredCache, TierOptions
from kvtier.codec import BlockHeader, BlockMeta
from kvtier.codec.container import RAW_META
from kvtier.keys import ChunkKeyer, Namespace
from kvtier.policy.admission import FrequencyAdmission
from kvtier.tiers.base import Tier, TierCapabilities, TierURL, TierUsage

LAYERS, KV_HEADS, CHUNK_TOKENS, HEAD_DIM = 2, 2, 16, 32
SHAPE = (LAYERS, 2, KV_HEADS, CHUNK_TOKENS, HEAD_DIM)
CHUNK_BYTES = int(np.prod(SHAPE)) * 2  # bf16
META = BlockMeta("bf16", SHAPE)
NAMESPACE = Namespace("tiny-test-model", "rev-1", "bf16", LAYERS, KV_HEADS, HEAD_DIM)
TierFactory = Callable[..., Tier]


# --- helpers ---------------------------------------------------------------------------------
def kv_chunk(key: bytes) -> np.ndarray:
    """The KV bytes a request computes for the chunk behind ``key`` (a function of the key)."""
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 2**16, size=SHAPE, dtype=np.uint16)


def request(*segments: int, start: int = 0) -> list[int]:
    """Token ids of a request: each segment is a run of ``length`` tokens of its own."""
    tokens: list[int] = []
    for i, length in enumerate(segments):
        base = start + i * 100_000
        tokens.extend(range(base, base + length))
    return tokens


def chunk_keys(n: int, start: int = 0) -> list[bytes]:
    """Keys of the first ``n`` chunks of a request of distinct tokens."""
    return ChunkKeyer(NAMESPACE, CHUNK_TOKENS).keys(request(n * CHUNK_TOKENS, start=start))


def buffers(n: int) -> list[np.ndarray]:
    """Engine-side buffers for ``n`` chunks, pre-filled with garbage so a missed write shows."""
    return [np.full(SHAPE, 0xDEAD, dtype=np.uint16) for _ in range(n)]


def assert_loaded(keys: Sequence[bytes], outs: Sequence[np.ndarray], loaded: int) -> None:
    """The first ``loaded`` buffers hold exactly the KV bytes of their keys."""
    for i, (key, out) in enumerate(zip(keys[:loaded], outs[:loaded], strict=True)):
        assert np.array_equal(out, kv_chunk(key)), f"chunk {i} does not hold its own KV bytes"


def load_checked(cache: TieredCache, keys: Sequence[bytes]) -> int:
    """Look ``keys`` up, load the hit prefix into fresh buffers and check every loaded chunk
    against its own KV bytes; how many chunks loaded."""
    found = cache.lookup(keys)
    outs = buffers(len(keys))
    loaded = cache.load(keys, outs, found).loaded
    assert_loaded(keys, outs, loaded)
    return loaded


def store_all(cache: TieredCache, keys: Sequence[bytes]) -> int:
    """Store the KV chunks of ``keys`` and wait for the background writes."""
    queued = cache.store(keys, [kv_chunk(k) for k in keys], META)
    assert cache.flush(timeout=30), "background writes did not finish"
    return queued


def fill_tier(url: str, namespace: Namespace, keys: Sequence[bytes], chunk_bytes: int) -> None:
    """Store blocks of ``chunk_bytes`` under ``keys`` in the tier at ``url`` and close it, as an
    earlier engine would have (block ``i`` holds the byte ``i``)."""
    from kvtier.tiers.registry import open_tier

    tier = open_tier(url, namespace.id)
    cache = TieredCache([tier], CacheConfig(chunk_tokens=CHUNK_TOKENS))
    cache.store(list(keys), [np.full(chunk_bytes, i, np.uint8) for i in range(len(keys))])
    assert cache.flush(10), "background writes did not finish"
    cache.close()
    tier.close()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until true or ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class WrappedTier(Tier):
    """Passes every verb to a real tier; subclasses add delay or failure around the calls."""

    scheme = "wrapped"
    capabilities = TierCapabilities()

    def __init__(self, inner: Tier, name: str | None = None):
        super().__init__(inner.namespace, name or inner.name)
        self.inner = inner

    @classmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> Tier:
        raise NotImplementedError("wrap a tier opened with open_tier")

    def _before(self, op: str) -> None:
        """Runs before each verb."""

    def contains(self, key: bytes) -> bool:
        self._before("contains")
        return self.inner.contains(key)

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        self._before("contains")
        return self.inner.contains_many(keys)

    def get_into(self, key: bytes, out) -> BlockHeader | None:
        self._before("get")
        return self.inner.get_into(key, out)

    def get_many_into(self, keys, outs):
        self._before("get")
        return self.inner.get_many_into(keys, outs)

    def put(self, key: bytes, payload, meta: BlockMeta = RAW_META) -> bool:
        self._before("put")
        return self.inner.put(key, payload, meta)

    def put_many(self, items):
        self._before("put")
        return self.inner.put_many(items)

    def delete(self, key: bytes) -> bool:
        self._before("delete")
        return self.inner.delete(key)

    def delete_many(self, keys):
        self._before("delete")
        return self.inner.delete_many(keys)

    def usage(self) -> TierUsage:
        self._before("usage")
        return self.inner.usage()

    def iter_keys(self) -> Iterator[bytes]:
        return self.inner.iter_keys()

    # the real tier does the evicting: listeners and pins go to it
    def add_eviction_listener(self, listener) -> None:
        self.inner.add_eviction_listener(listener)

    def add_spill_listener(self, listener) -> None:
        self.inner.add_spill_listener(listener)

    def set_pinned(self, pinned) -> None:
        self.inner.set_pinned(pinned)


class SlowTier(WrappedTier):
    """A real tier whose writes take ``put_delay`` seconds each call (a throttled device)."""

    def __init__(self, inner: Tier, put_delay: float, name: str | None = None):
        super().__init__(inner, name)
        self.put_delay = put_delay
        self.writing = threading.Event()

    def _before(self, op: str) -> None:
        if op == "put":
            self.writing.set()
            time.sleep(self.put_delay)


class DeadTier(WrappedTier):
    """A real tier behind a link that can drop: while ``dead``, every verb raises."""

    def __init__(self, inner: Tier, name: str | None = None):
        super().__init__(inner, name)
        self.dead = False
        self.failures = 0

    def _before(self, op: str) -> None:
        if self.dead:
            self.failures += 1
            raise ConnectionError(f"{self.name}: connection refused")


# --- the scenarios ---------------------------------------------------------------------------
class CacheConformance:
    """Narrated scenarios of a TieredCache over a real fast tier and a real slow tier."""

    @pytest.fixture
    def fast_tier(self) -> TierFactory:
        raise NotImplementedError("give the fast_tier fixture: (chunks, name) -> Tier")

    @pytest.fixture
    def slow_tier(self) -> TierFactory:
        raise NotImplementedError("give the slow_tier fixture: (chunks, name) -> Tier")

    @pytest.fixture
    def make_cache(self):
        caches: list[TieredCache] = []

        def make(stack: Sequence[Tier], **config) -> TieredCache:
            config.setdefault("chunk_tokens", CHUNK_TOKENS)
            cache = TieredCache(stack, CacheConfig(**config))
            caches.append(cache)
            return cache

        yield make
        for cache in caches:
            cache.close(timeout=10)

    # -- prefix hits ------------------------------------------------------------------------
    def test_second_request_finds_the_prefix_the_first_stored(
        self, fast_tier, slow_tier, make_cache
    ):
        cache = make_cache([fast_tier(64, "fast"), slow_tier(256, "slow")])
        keyer = ChunkKeyer(NAMESPACE, CHUNK_TOKENS)
        # A first request of 4 full chunks and a partial tail computes its KV and stores it.
        first = keyer.keys(request(4 * CHUNK_TOKENS + 5))
        assert len(first) == 4  # the partial tail is not stored
        assert store_all(cache, first) == 4
        # A second request shares those 4 chunks, then asks something new.
        second = keyer.keys(request(4 * CHUNK_TOKENS + 5, 3 * CHUNK_TOKENS))
        found = cache.lookup(second)
        assert found.requested == 7 and found.hit_chunks == 4
        assert found.hit_tokens == 4 * CHUNK_TOKENS
        assert found.tier_names == ["fast"] * 4
        outs = buffers(len(second))
        loaded = cache.load(second, outs, found)
        assert loaded.loaded == 4 and loaded.bytes == 4 * CHUNK_BYTES
        assert loaded.per_tier == {"fast": 4}
        assert_loaded(second, outs, 4)
        assert (outs[4] == 0xDEAD).all()  # nothing is written past the prefix
        fast = cache.metrics.as_dict()["tiers"]["fast"]
        assert fast["hits"] == 4 and fast["hit_tokens"] == 4 * CHUNK_TOKENS
        assert fast["bytes_read"] == 4 * CHUNK_BYTES

    def test_prefix_ends_at_the_first_chunk_no_tier_holds(self, fast_tier, slow_tier, make_cache):
        cache = make_cache([fast_tier(64, "fast"), slow_tier(256, "slow")])
        keys = chunk_keys(6)
        # chunks 0, 1 and 3..5 were stored by earlier requests, chunk 2 was never stored
        store_all(cache, keys[:2] + keys[3:])
        found = cache.lookup(keys)
        assert found.hit_chunks == 2
        outs = buffers(6)
        assert cache.load(keys, outs).loaded == 2
        assert_loaded(keys, outs, 2)
        assert cache.lookup([]).hit_chunks == 0

    def test_a_prefix_can_span_tiers(self, fast_tier, slow_tier, make_cache):
        fast, slow = fast_tier(64, "fast"), slow_tier(256, "slow")
        cache = make_cache([fast, slow], tiers=("through", "none"))
        keys = chunk_keys(5)
        # chunks 2..4 were written to the slow tier by another server; 0 and 1 are stored here
        for key in keys[2:]:
            assert slow.put(key, kv_chunk(key), META)
        store_all(cache, keys[:2])
        found = cache.lookup(keys)
        assert found.hit_chunks == 5
        assert found.tiers == [0, 0, 1, 1, 1]
        assert found.per_tier() == {"fast": 2, "slow": 3}
        outs = buffers(5)
        result = cache.load(keys, outs, found)
        assert result.loaded == 5 and result.per_tier == {"fast": 2, "slow": 3}
        assert_loaded(keys, outs, 5)

    # -- promotion --------------------------------------------------------------------------
    def test_a_hit_in_the_slow_tier_is_promoted_to_the_fast_tier(
        self, fast_tier, slow_tier, make_cache
    ):
        fast, slow = fast_tier(64, "fast"), slow_tier(256, "slow")
        cache = make_cache([fast, slow])
        keys = chunk_keys(3)
        for key in keys:  # only the slow tier holds them (e.g. after a restart)
            assert slow.put(key, kv_chunk(key), META)
        assert cache.lookup(keys).tier_names == ["slow"] * 3
        outs = buffers(3)
        assert cache.load(keys, outs).loaded == 3
        assert_loaded(keys, outs, 3)
        assert cache.flush(timeout=30)
        # the next request finds them in the fast tier
        assert cache.lookup(keys).tier_names == ["fast"] * 3
        outs = buffers(3)
        assert cache.load(keys, outs).per_tier == {"fast": 3}
        assert_loaded(keys, outs, 3)
        assert cache.metrics.as_dict()["tiers"]["fast"]["promotions"] == 3

    def test_promotion_waits_for_a_second_hit_under_frequency_admission(
        self, fast_tier, slow_tier, make_cache
    ):
        fast, slow = fast_tier(64, "fast"), slow_tier(256, "slow")
        options = TierOptions(admission=FrequencyAdmission(min_hits=2))
        cache = make_cache([fast, slow], tiers=(options, "through"))
        keys = chunk_keys(2)
        for key in keys:
            slow.put(key, kv_chunk(key), META)
        cache.load(keys, buffers(2))
        cache.flush(timeout=30)
        assert cache.lookup(keys).tier_names == ["slow", "slow"]  # once: not promoted
        cache.load(keys, buffers(2))
        cache.flush(timeout=30)
        assert cache.lookup(keys).tier_names == ["fast", "fast"]  # twice: promoted
        assert cache.metrics.as_dict()["tiers"]["fast"]["not_admitted"] == 2

    def test_no_promotion_when_the_fast_tier_opts_out(self, fast_tier, slow_tier, make_cache):
        fast, slow = fast_tier(64, "fast"), slow_tier(256, "slow")
        cache = make_cache([fast, slow], tiers=(TierOptions(promote=False), "through"))
        keys = chunk_keys(2)
        for key in keys:
            slow.put(key, kv_chunk(key), META)
        cache.load(keys, buffers(2))
        cache.flush(timeout=30)
        assert cache.lookup(keys).tier_names == ["slow", "slow"]

    # -- write modes ------------------------------------------------------------------------
    def test_write_through_puts_every_chunk_in_both_tiers(self, fast_tier, slow_tier, make_cache):
        fast, slow = fast_tier(64, "fast"), slow_tier(256, "slow")
        cache = make_cache([fast, slow], tiers=("through", "through"))
        keys = chunk_keys(5)
        store_all(cache, keys)
        assert fast.contains_many(keys) == [True] * 5
        assert slow.contains_many(keys) == [True] * 5
        tiers = cache.metrics.as_dict()["tiers"]
        assert tiers["fast"]["writes"] == tiers["slow"]["writes"] == 5
        assert tiers["slow"]["bytes_written"] == 5 * CHUNK_BYTES

    def test_write_back_writes_the_slow_tier_only_when_the_fast_tier_evicts(
        self, fast_tier, slow_tier, make_cache
    ):
        fast, slow = fast_tier(4, "fast"), slow_tier(256, "slow")
        cache = make_cache([fast, slow], tiers=("through", "back"))
        keys = chunk_keys(4)
        # a request stores 4 chunks: the fast tier holds them, the slow tier has nothing yet
        store_all(cache, keys)
        assert fast.contains_many(keys) == [True] * 4
        assert slow.contains_many(keys) == [False] * 4
        # a second request stores 4 more: the fast tier evicts the first 4 into the slow tier
        more = chunk_keys(4, start=7_000_000)
        store_all(cache, more)
        assert fast.contains_many(more) == [True] * 4
        assert slow.contains_many(keys) == [True] * 4
        assert slow.contains_many(more) == [False] * 4
        tiers = cache.metrics.as_dict()["tiers"]
        assert tiers["fast"]["evictions"] == 4
        assert tiers["slow"]["write_backs"] == 4 and tiers["slow"]["writes"] == 4
        # the first request comes back: its prefix is found in the slow tier, bytes intact
        found = cache.lookup(keys)
        assert found.hit_chunks == 4 and found.tier_names == ["slow"] * 4
        outs = buffers(4)
        assert cache.load(keys, outs, found).loaded == 4
        assert_loaded(keys, outs, 4)

    # -- a full queue -----------------------------------------------------------------------
    def test_a_full_write_queue_drops_and_counts_instead_of_blocking(
        self, fast_tier, slow_tier, make_cache
    ):
        fast, slow = fast_tier(64, "fast"), SlowTier(slow_tier(256, "slow"), put_delay=1.0)
        cache = make_cache([fast, slow], queue_chunks=2, write_batch=1)
        first = chunk_keys(1, start=9_000_000)
        cache.store(first, [kv_chunk(first[0])], META)
        assert slow.writing.wait(10)  # the slow tier's writer is now stuck in a 1 s write
        assert wait_for(lambda: fast.contains(first[0]))  # the fast tier's queue is empty
        keys = chunk_keys(10)
        began = time.monotonic()
        queued = cache.store(keys, [kv_chunk(k) for k in keys], META)
        took = time.monotonic() - began
        assert took < 0.5, "store waited for the slow tier"
        assert queued == 2  # both queues hold two chunks; the rest was dropped at once
        tiers = cache.metrics.as_dict()["tiers"]
        assert tiers["slow"]["dropped_writes"] == 8
        assert tiers["fast"]["dropped_writes"] == 8
        slow.put_delay = 0.0  # the device recovers: what was queued gets written
        assert cache.flush(timeout=30)
        assert cache.lookup(keys).hit_chunks == 2
        assert slow.contains_many(keys) == [True] * 2 + [False] * 8

    # -- leases -----------------------------------------------------------------------------
    def test_pinned_chunks_survive_pressure_until_the_lease_ends(
        self, fast_tier, slow_tier, make_cache
    ):
        fast = fast_tier(4, "fast")
        cache = make_cache([fast, slow_tier(256, "slow")], tiers=("through", "none"))
        keys = chunk_keys(2)
        store_all(cache, keys)
        # a request is about to load its 2 chunks and pins them meanwhile
        lease = cache.pin(keys, ttl_s=60)
        assert lease.active and all(cache.is_pinned(k) for k in keys)
        # other requests fill the tier over and over
        for round_ in range(3):
            store_all(cache, chunk_keys(4, start=1_000_000 * (round_ + 1)))
        assert fast.contains_many(keys) == [True, True]
        assert cache.metrics.as_dict()["tiers"]["all"]["pinned_keys"] == 2
        lease.release()
        assert not lease.active and not cache.is_pinned(keys[0])
        store_all(cache, chunk_keys(4, start=9_000_000))
        assert fast.contains_many(keys) == [False, False]

    def test_a_forgotten_lease_expires_by_itself(self, fast_tier, slow_tier, make_cache):
        fast = fast_tier(4, "fast")
        cache = make_cache([fast, slow_tier(256, "slow")], tiers=("through", "none"))
        keys = chunk_keys(2)
        store_all(cache, keys)
        lease = cache.pin(keys, ttl_s=0.2)  # the holder never releases it
        store_all(cache, chunk_keys(4, start=1_000_000))
        assert fast.contains_many(keys) == [True, True]
        assert wait_for(lambda: not lease.active, timeout=5)
        store_all(cache, chunk_keys(4, start=2_000_000))
        assert fast.contains_many(keys) == [False, False]

    # -- failures ---------------------------------------------------------------------------
    def test_a_dead_slow_tier_degrades_to_recompute(self, fast_tier, slow_tier, make_cache):
        fast, slow = fast_tier(4, "fast"), DeadTier(slow_tier(256, "slow"))
        cache = make_cache([fast, slow], error_backoff_s=0.2, error_backoff_max_s=0.2)
        keys = chunk_keys(2)
        store_all(cache, keys)
        store_all(cache, chunk_keys(4, start=3_000_000))  # pushes keys out of the fast tier
        assert fast.contains_many(keys) == [False, False]
        # the slow tier, the only one still holding the first request's chunks, goes down
        slow.dead = True
        found = cache.lookup(keys)
        assert found.hit_chunks == 0  # a miss: the engine recomputes, nothing is raised
        result = cache.load(keys, buffers(2))
        assert result.loaded == 0 and result.located == 0  # its breaker is open: not asked
        assert not cache.tier_up(1)
        # stores keep working for the fast tier
        more = chunk_keys(2, start=5_000_000)
        assert cache.store(more, [kv_chunk(k) for k in more], META) == 2
        assert cache.flush(timeout=30)
        assert cache.lookup(more).tier_names == ["fast", "fast"]
        tiers = cache.metrics.as_dict()["tiers"]
        assert tiers["slow"]["tier_errors"] >= 1
        assert tiers["slow"]["dropped_writes"] >= 2
        # the link comes back: after the back-off the slow tier serves again
        slow.dead = False
        time.sleep(0.25)
        found = cache.lookup(keys)
        assert found.tier_names == ["slow", "slow"]
        outs = buffers(2)
        assert cache.load(keys, outs, found).loaded == 2
        assert_loaded(keys, outs, 2)

    def test_a_tier_dying_between_lookup_and_load_is_a_miss(self, fast_tier, slow_tier, make_cache):
        slow = DeadTier(slow_tier(256, "slow"))
        cache = make_cache([fast_tier(64, "fast"), slow], tiers=("through", "none"))
        keys = chunk_keys(4)
        store_all(cache, keys[:2])
        for key in keys[2:]:
            slow.inner.put(key, kv_chunk(key), META)
        found = cache.lookup(keys)
        assert found.tiers == [0, 0, 1, 1]
        slow.dead = True
        outs = buffers(4)
        result = cache.load(keys, outs, found)
        assert result.loaded == 2 and result.located == 4
        assert result.errors == 1 and result.skipped == 0  # it raised: asked once
        assert_loaded(keys, outs, 2)
        # within the back-off the tier is not asked again: the read is skipped, and says so
        asked = slow.failures
        result = cache.load(keys, buffers(4), found)
        assert result.loaded == 2 and result.errors == 1 and result.skipped == 1
        assert slow.failures == asked

    # -- prefetch ---------------------------------------------------------------------------
    def test_prefetch_brings_the_prefix_to_the_fast_tier(self, fast_tier, slow_tier, make_cache):
        fast, slow = fast_tier(64, "fast"), slow_tier(256, "slow")
        cache = make_cache([fast, slow], prefetch_pin_s=30)
        keys = chunk_keys(5)
        store_all(cache, keys[:1])
        for key in keys[1:4]:  # chunk 4 is nowhere
            slow.put(key, kv_chunk(key), META)
        # the scheduler knows the request is coming and prefetches while it waits
        result = cache.prefetch(keys).result(timeout=30)
        assert result.ready == 4 and result.promoted == 3
        assert result.lease is not None and all(cache.is_pinned(k) for k in keys[:4])
        assert cache.lookup(keys).tier_names == ["fast"] * 4
        outs = buffers(5)
        assert cache.load(keys, outs).loaded == 4
        assert_loaded(keys, outs, 4)
        result.lease.release()
        assert cache.prefetch(chunk_keys(3, start=4_000_000)).result(timeout=30).ready == 0

    # -- threads ----------------------------------------------------------------------------
    def test_threads_storing_and_loading_the_same_keys_never_see_torn_data(
        self, fast_tier, slow_tier, make_cache
    ):
        cache = make_cache(
            [fast_tier(6, "fast"), slow_tier(256, "slow")], tiers=("through", "back")
        )
        sets = [chunk_keys(4, start=s * 1_000_000) for s in range(4)]
        stop = time.monotonic() + 2.0
        failures: list[str] = []
        loads = [0]

        def worker(seed: int) -> None:
            rng = np.random.default_rng(seed)
            while time.monotonic() < stop and not failures:
                keys = sets[int(rng.integers(len(sets)))]
                if rng.random() < 0.5:
                    cache.store(keys, [kv_chunk(k) for k in keys], META)
                else:
                    outs = buffers(len(keys))
                    loaded = cache.load(keys, outs).loaded
                    loads[0] += loaded
                    try:
                        assert_loaded(keys, outs, loaded)
                    except AssertionError as exc:
                        failures.append(str(exc))

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not failures
        assert loads[0] > 0
        assert cache.flush(timeout=30)
        for keys in sets:  # and at rest every stored chunk is still whole
            outs = buffers(4)
            loaded = cache.load(keys, outs).loaded
            assert_loaded(keys, outs, loaded)

    # -- metrics ----------------------------------------------------------------------------
    def test_metrics_export_as_dict_and_prometheus(self, fast_tier, slow_tier, make_cache):
        from prometheus_client.parser import text_string_to_metric_families

        cache = make_cache([fast_tier(64, "fast"), slow_tier(256, "slow")])
        keys = chunk_keys(3)
        store_all(cache, keys)
        cache.load(keys, buffers(3))
        data = cache.metrics.as_dict()
        assert data["lookups"] == 1 and data["prefix_chunks"] == 3
        assert data["tiers"]["fast"]["read_seconds"]["count"] == 3
        assert data["tiers"]["slow"]["writes"] == 3
        text = cache.metrics.prometheus_text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        hits = {s.labels["tier"]: s.value for s in families["kvtier_cache_hits"].samples}
        assert hits == {"fast": 3.0, "slow": 0.0}
        assert "kvtier_cache_read_seconds" in families
        other = make_cache([fast_tier(8, "fast"), slow_tier(8, "slow")])
        assert other.metrics.registry is not cache.metrics.registry
        assert other.metrics.as_dict()["tiers"]["fast"]["hits"] == 0
