"""The TieredCache: lookup, load, store, promote, write back, prefetch and pin over ordered tiers.

Tiers are ordered fast→slow. A chunk "lives" in the fastest tier holding it. The engine's calls
(lookup, load, store, prefetch, pin) never raise because a tier is slow, full, corrupt or down:
a bad block is a counted miss (and is deleted), a failing tier is a counted miss and is skipped
for a while, a full write queue drops the write and counts it.

The cache composes its parts: every tier call goes through the ``guard`` (a circuit breaker per
tier, under a lock of its own, and the change epoch), writes through ``writes`` (one writer
thread and bounded queue per tier: stores, promotions, write-backs, deletes), copies into faster
tiers through the ``promoter`` (promotion after loads, prefetch on a small pool), and pins through
``leases``. Tiers are called from several threads at once, so they must be thread-safe (the Tier
contract).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from kvtier.cache.breaker import Breakers
from kvtier.cache.config import CacheConfig
from kvtier.cache.guard import SKIPPED, TierGuard
from kvtier.cache.leases import Lease, LeaseTable
from kvtier.cache.metrics import CacheMetrics
from kvtier.cache.promoter import Promoter
from kvtier.cache.results import LoadResult, LookupResult, PrefetchResult
from kvtier.cache.staging import Lender
from kvtier.cache.writes import Writes
from kvtier.codec import BlockHeader, BlockMeta
from kvtier.codec.container import RAW_META
from kvtier.errors import ConfigError
from kvtier.tiers.base import Tier

log = logging.getLogger("kvtier.cache")


class TieredCache(contextlib.AbstractContextManager):
    """A KV block cache over ``tiers`` (fast→slow), configured by ``config``."""

    def __init__(self, tiers: Sequence[Tier], config: CacheConfig | None = None):
        if not tiers:
            raise ConfigError("a TieredCache needs at least one tier, e.g. memory://?size=8GiB")
        self.config = config = config or CacheConfig()
        self._tiers = tuple(tiers)
        opts = config.options_for(len(self._tiers))
        self.names = _unique_names(self._tiers)
        self.metrics = CacheMetrics(self.names, config.chunk_tokens, config.latency_buckets)
        self._leases = LeaseTable(config.max_lease_s)
        breakers = Breakers(len(self._tiers), config.error_backoff_s, config.error_backoff_max_s)
        self._guard = TierGuard(self._tiers, self.names, self.metrics, breakers, self._discard)
        self._guard.saw_block(config.block_bytes or 0)
        self._writes = Writes(self._guard, opts, config)
        self._promoter = Promoter(
            self._guard,
            self._writes,
            opts,
            self._leases,
            config,
            functools.partial(self._locate, record=False),
        )
        self._eviction_listeners: list[Callable[[str, bytes], None]] = []
        # one tier whose store answers every read (a shared one: nothing listed here first)
        self._reads_first = len(self._tiers) == 1 and self._tiers[0].capabilities.shared
        self._closed = False
        self._close_lock = threading.Lock()
        for i, tier in enumerate(self._tiers):
            tier.set_pinned(self._leases.is_pinned)
            tier.add_eviction_listener(functools.partial(self._on_evicted, i))
            if i + 1 < len(self._tiers) and opts[i + 1].write == "back":
                tier.add_spill_listener(functools.partial(self._writes.spill, i + 1))
        self.metrics.add_gauge(
            "queue_depth", "writes waiting in the tier's queue", self._writes.depths
        )
        self.metrics.add_gauge("used_bytes", "bytes the tier holds", self._used_bytes)
        self.metrics.add_gauge("pinned_keys", "keys pinned by leases now", self._pinned)
        self.metrics.add_gauge(
            "tier_down",
            "1 while the tier is skipped after failing (circuit open)",
            self._guard.down_gauge,
        )

    # --- introspection -------------------------------------------------------------------
    @property
    def tiers(self) -> tuple[Tier, ...]:
        """The tiers, fast→slow."""
        return self._tiers

    def is_pinned(self, key: bytes) -> bool:
        """Whether an unexpired lease pins ``key``."""
        return self._leases.is_pinned(key)

    @property
    def epoch(self) -> int:
        """Grows whenever what a lookup answers may have changed through this cache: a block
        written, deleted or evicted, a tier taken out of use or back (other processes' writes
        to shared tiers are not seen here)."""
        return self._guard.epoch

    def add_eviction_listener(self, listener: Callable[[str, bytes], None]) -> None:
        """Call ``listener(tier name, key)`` for every block a tier evicts (from the tier's
        thread, maybe under its lock: keep it short and never call back into the cache)."""
        self._eviction_listeners.append(listener)

    def add_write_listener(self, listener: Callable[[str, list[bytes], list[bytes]], None]) -> None:
        """Call ``listener(tier name, keys stored, keys deleted)`` after each batch a writer
        thread applies to a tier, and after a prefetch's copies into the first tier (from that
        thread: keep it short, never call back into the cache). Stored: written, or found
        already there."""
        names = self.names

        def named(t: int, stored: list[bytes], deleted: list[bytes]) -> None:
            listener(names[t], stored, deleted)

        self._writes.listeners.append(named)

    def tier_up(self, index: int) -> bool:
        """False while tier ``index`` is being skipped after a failure."""
        return self._guard.up(index)

    # --- lookup --------------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes]) -> LookupResult:
        """The longest contiguous prefix of ``keys`` held by some tier, and which tier holds each.

        One ``contains_many`` per tier (only for keys not found in a faster tier).
        """
        return self._locate(keys, record=True)

    def _locate(self, keys: Sequence[bytes], record: bool) -> LookupResult:
        guard = self._guard
        start = time.perf_counter()
        n = len(keys)
        n_tiers = len(self._tiers)
        hits = [0] * n_tiers
        misses = [0] * n_tiers
        loc: list[int] = []
        pending: list[int] | None = None  # indices not found yet; None: no tier answered
        for t, tier in enumerate(self._tiers):
            if pending is not None and not pending:
                break
            if not guard.up(t):
                continue
            asked = keys if pending is None else [keys[i] for i in pending]
            began = time.perf_counter()
            try:
                found = tier.contains_many(asked)
            except Exception as exc:
                guard.failed(t, "contains", exc)
                continue
            guard.succeeded(t)
            if record:
                self.metrics.observe("contains", t, time.perf_counter() - began, len(asked))
            held = sum(found)
            misses[t] = len(asked) - held
            if pending is None:
                if held == n:
                    loc, pending = [t] * n, []
                    break
                loc = [t if f else -1 for f in found]
                pending = [i for i, f in enumerate(found) if not f]
            elif held:
                still = []
                for i, f in zip(pending, found, strict=True):
                    if f:
                        loc[i] = t
                    else:
                        still.append(i)
                pending = still
        prefix = 0 if pending is None else (pending[0] if pending else n)
        del loc[prefix:]
        seconds = time.perf_counter() - start
        if record:
            for t in range(n_tiers):
                hits[t] = loc.count(t) if n_tiers > 1 else len(loc)
            self.metrics.record_lookup(n, prefix, hits, misses, seconds)
        return LookupResult(n, loc, self.names, seconds, self.config.chunk_tokens)

    # --- load ----------------------------------------------------------------------------
    def load(
        self,
        keys: Sequence[bytes],
        outs: Sequence,
        lookup: LookupResult | None = None,
        promised: bool = False,
        where: Sequence[int] | None = None,
    ) -> LoadResult:
        """Read the leading hit chunks of ``keys`` into ``outs`` (one buffer per chunk).

        Stops at the first chunk no tier can serve (a miss, a bad block, a failing tier), so
        ``outs[:loaded]`` hold the prefix and nothing after it may be used. Pass the
        ``lookup`` just made to skip locating again. ``promised``: another process's lookup
        found these chunks, so tiers that list other processes' blocks lazily refresh their
        listing before a chunk is called missing. ``where``: the tier each chunk was found in
        by such a lookup: each is read there, without locating it again (a round trip to
        every shared tier), and a chunk missing there is looked for in the slower tiers.
        Chunks served by a slower tier are copied into the faster write-through tiers in the
        background (promotion). A cache of one shared tier reads without locating first: its
        read answers as a lookup would, one round trip instead of two.
        """
        guard = self._guard
        start = time.perf_counter()
        if lookup is None and where is None and self._reads_first:
            where = [0] * len(keys)  # its one tier answers a read as a lookup would
        told = (  # the chunks' tiers from a lookup elsewhere, each a tier of this cache
            lookup is None
            and where is not None
            and len(where) >= len(keys)
            and all(0 <= t < len(self._tiers) for t in where[: len(keys)])
        )
        if lookup is not None:
            found = lookup
        elif told and where is not None:
            tiers = list(where[: len(keys)])
            found = LookupResult(len(keys), tiers, self.names, 0.0, self.config.chunk_tokens)
        else:
            found = self._locate(keys, record=True)
            if promised and found.hit_chunks < len(keys) and self._refresh():
                found = self._locate(keys, record=False)
        loc = found.tiers
        n = min(len(loc), len(outs), len(keys))
        served: list[int] = []
        headers: list[BlockHeader] = []
        corrupt = errors = skipped = 0
        missing = n  # with ``where``: the first chunk no tier had
        for t, i, j in found.runs(n):
            results = guard.read(t, keys[i:j], outs[i:j])
            stopped = False
            for off, result in enumerate(results):
                at, header = t, result
                if not isinstance(result, BlockHeader):
                    skipped += result is SKIPPED
                    c, e = guard.account(t, keys[i + off], result)
                    at, header, c2, e2 = guard.read_below(t, keys[i + off], outs[i + off])
                    corrupt, errors = corrupt + c + c2, errors + e + e2
                    if header is None:
                        if not (c or e or c2 or e2):
                            missing = i + off
                        stopped = True
                        break
                served.append(at)
                headers.append(header)
            if stopped:
                break
        nbytes = self._count_reads(served, headers)
        if headers:
            guard.saw_block(max(h.raw_len for h in headers))
        self._promoter.promote(keys, outs, served, headers)
        seconds = time.perf_counter() - start
        self.metrics.record_load(len(served), seconds)
        per_tier: dict[str, int] = {}
        for t in served:
            per_tier[self.names[t]] = per_tier.get(self.names[t], 0) + 1
        return LoadResult(
            len(served),
            nbytes,
            per_tier,
            seconds,
            served,
            corrupt=corrupt,
            errors=errors,
            located=missing if told else len(loc),
            skipped=skipped,
        )

    def _count_reads(self, served: list[int], headers: list[BlockHeader]) -> int:
        per: dict[int, list[int]] = {}
        for t, header in zip(served, headers, strict=True):
            entry = per.setdefault(t, [0, 0])
            entry[0] += 1
            entry[1] += header.raw_len
        for t, (chunks, nbytes) in per.items():
            self.metrics.count(t, reads=chunks, bytes_read=nbytes)
        return sum(nbytes for _, nbytes in per.values())

    def _refresh(self) -> bool:
        """Refresh every tier in use that lists other processes' blocks; whether any did."""
        refreshed = False
        for t, tier in enumerate(self._tiers):
            if self._guard.up(t):
                with contextlib.suppress(Exception):  # a refresh is only ever a second look
                    refreshed = tier.refresh() or refreshed
        return refreshed

    # --- store ---------------------------------------------------------------------------
    def store(
        self,
        keys: Sequence[bytes],
        payloads: Sequence,
        meta: BlockMeta = RAW_META,
        copy: bool = True,
        values: Sequence[float] | None = None,
        release: Callable[[object], None] | None = None,
    ) -> int:
        """Queue ``payloads`` (one buffer per chunk) for every write-through tier; never waits.

        Returns how many leading chunks were queued (for the tier that took most); what a full
        queue cannot take is dropped and counted. With ``copy=False`` the caller promises not
        to change the buffers until :meth:`flush` returns, or, given ``release``, until
        ``release(payload)`` hands each one back (a :class:`~kvtier.cache.StagingPool`'s
        ``give``: buffers reused, not faulted in afresh). ``values`` (seconds of prefill each
        chunk saves) feed cost-aware eviction; they travel in each block's header.
        """
        if len(keys) != len(payloads):
            raise ValueError(f"store got {len(keys)} keys but {len(payloads)} payloads")
        if values is not None and len(values) != len(keys):
            raise ValueError(f"store got {len(keys)} keys but {len(values)} values")
        self.metrics.record_store(len(keys))
        return self._writes.store(keys, payloads, meta, copy, values, release)

    def lender(self) -> Lender | None:
        """The first tier, where it lends buffers that a store puts in place (a ``memory://``
        tier storing raw blocks, written through): give it to a :class:`StagingPool`, so a
        stored chunk is copied once, into its slot. None otherwise."""
        if not self._tiers or self._writes.through[:1] != [0]:
            return None
        tier = self._tiers[0]
        return tier if callable(getattr(tier, "lend", None)) and tier.codec == "raw" else None

    def discard(self, keys: Sequence[bytes], tier: str = "") -> None:
        """Queue the deletion of ``keys`` from the tier named ``tier`` (``""``: every tier; a
        name this cache has no tier of: none): blocks no longer worth keeping."""
        if not tier:
            where: range | tuple[int, ...] = range(len(self._tiers))
        else:
            where = (self.names.index(tier),) if tier in self.names else ()
        for t in where:
            for key in keys:
                self._writes.discard(t, key)

    def _discard(self, t: int, key: bytes) -> None:
        self._writes.discard(t, key)

    # --- tier events (called by tiers, possibly under their locks) -------------------------
    def _on_evicted(self, t: int, key: bytes) -> None:
        self.metrics.count(t, evictions=1)
        self._guard.changed()
        for listener in self._eviction_listeners:
            try:
                listener(self.names[t], key)
            except Exception:  # a listener's bug must not fail the tier's write
                log.exception("kvtier cache: an eviction listener failed")

    # --- prefetch and pins ----------------------------------------------------------------
    def prefetch(self, keys: Sequence[bytes]) -> Future[PrefetchResult]:
        """Bring the hit prefix of ``keys`` into the fastest tier in the background.

        The Future gives a :class:`PrefetchResult`; the chunks it reports ready are pinned for
        ``prefetch_pin_s`` so that a load right after finds them in the fastest tier.
        """
        return self._promoter.prefetch(keys)

    def pin(self, keys: Sequence[bytes], ttl_s: float | None = None) -> Lease:
        """Keep ``keys`` from being evicted until the lease is released or ``ttl_s`` passes.

        ``ttl_s`` defaults to ``lease_ttl_s`` and is capped at ``max_lease_s``: nothing stays
        pinned forever. Tiers honour pins through :meth:`Tier.is_pinned`.
        """
        return self._leases.acquire(list(keys), ttl_s or self.config.lease_ttl_s)

    # --- life cycle ------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued writes (and the write-backs they cause) are done; False on timeout."""
        return self._writes.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Finish queued writes (up to ``timeout``), stop the threads, unpin everything.

        The tiers stay open: whoever opened them closes them.
        """
        with self._close_lock:
            if self._closed:
                return
            self._promoter.close()
            self._writes.flush(timeout)
            self._closed = True
            self._writes.close(timeout)
            for tier in self._tiers:
                tier.set_pinned(None)

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TieredCache {' → '.join(self.names)}>"

    # --- gauges ------------------------------------------------------------------------------
    def _used_bytes(self):
        out = []
        for i, tier in enumerate(self._tiers):
            if self._guard.up(i):
                try:
                    out.append((self.names[i], tier.usage().used_bytes))
                except Exception as exc:
                    self._guard.failed(i, "usage", exc)
        return out

    def _pinned(self):
        return [("all", self._leases.pinned_keys())]


def _unique_names(tiers: Sequence[Tier]) -> tuple[str, ...]:
    names: list[str] = []
    for i, tier in enumerate(tiers):
        name = tier.name
        names.append(name if name not in names else f"{name}#{i}")
    return tuple(names)
