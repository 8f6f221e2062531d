"""The TieredCache: lookup, load, store, promote, write back, prefetch and pin over ordered tiers.

Tiers are ordered fast→slow. A chunk "lives" in the fastest tier holding it. The engine's calls
(lookup, load, store, prefetch, pin) never raise because a tier is slow, full, corrupt or down:
a bad block is a counted miss (and is deleted), a failing tier is a counted miss and is skipped
for a while, a full write queue drops the write and counts it.

The skipping is a circuit breaker per tier (``breaker``, under a lock of its own): a tier
that raised is skipped for ``error_backoff_s``, then one call tries it again; each further
failure in a row doubles the wait, up to ``error_backoff_max_s``, and the first success closes
the breaker. A tier whose server died or hangs thus costs one bounded timeout per wait, not one
per request, and is used again within ``error_backoff_max_s`` (plus one operation) of answering
again. ``tier_down`` (a gauge) and ``tier_outages`` (a counter) show it in the metrics.

Threads: the caller's threads run lookup/load; one writer thread per tier drains that tier's
bounded queue (stores, promotions, write-backs, deletes); a small pool runs prefetches. Tiers
are called from several threads at once, so they must be thread-safe (the Tier contract).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from kvtier.cache.breaker import Breakers
from kvtier.cache.config import CacheConfig
from kvtier.cache.leases import Lease, LeaseTable
from kvtier.cache.metrics import CacheMetrics
from kvtier.cache.results import LoadResult, LookupResult, PrefetchResult
from kvtier.cache.workers import TierWriter, WriteJob
from kvtier.codec import BlockError, BlockHeader, BlockMeta, BufferTooSmallError
from kvtier.codec.container import RAW_META
from kvtier.errors import ConfigError
from kvtier.tiers.base import Tier

log = logging.getLogger("kvtier.cache")

_DEFAULT_BLOCK_BYTES = 1 << 20
_MAX_BLOCK_BYTES = 1 << 31


class _TierDown:
    """Stands in for the result of a read the tier could not serve (it raised, or was
    skipped because its breaker is open)."""


_DOWN = _TierDown()  # the tier raised
_SKIPPED = _TierDown()  # the tier's breaker was open: not asked


class TieredCache:
    """A KV block cache over ``tiers`` (fast→slow), configured by ``config``."""

    def __init__(self, tiers: Sequence[Tier], config: CacheConfig | None = None):
        if not tiers:
            raise ConfigError("a TieredCache needs at least one tier, e.g. memory://?size=8GiB")
        self.config = config = config or CacheConfig()
        self._tiers = tuple(tiers)
        self._opts = config.options_for(len(self._tiers))
        self.names = _unique_names(self._tiers)
        self.metrics = CacheMetrics(self.names, config.chunk_tokens, config.latency_buckets)
        self._leases = LeaseTable(config.max_lease_s)
        self._breakers = Breakers(
            len(self._tiers), config.error_backoff_s, config.error_backoff_max_s
        )
        self._changes = itertools.count(1)
        self._epoch = 0
        self._eviction_listeners: list[Callable[[str, bytes], None]] = []
        self._admit_lock = threading.Lock()
        self._block_bytes = config.block_bytes or 0
        self._closed = False
        self._close_lock = threading.Lock()
        self._through = [i for i, o in enumerate(self._opts) if o.write == "through"]
        self._promote_into = [
            [u for u in range(t) if self._opts[u].write == "through" and self._opts[u].promote]
            for t in range(len(self._tiers))
        ]
        self._writers = [
            TierWriter(
                self.names[i],
                config.queue_chunks,
                config.write_batch,
                functools.partial(self._write, i),
            )
            for i in range(len(self._tiers))
        ]
        self._prefetcher = ThreadPoolExecutor(
            config.prefetch_workers, thread_name_prefix="kvtier-prefetch"
        )
        for i, tier in enumerate(self._tiers):
            tier.set_pinned(self._leases.is_pinned)
            tier.add_eviction_listener(functools.partial(self._on_evicted, i))
            if i + 1 < len(self._tiers) and self._opts[i + 1].write == "back":
                tier.add_spill_listener(functools.partial(self._on_spill, i + 1))
        self.metrics.add_gauge("queue_depth", "writes waiting in the tier's queue", self._depths)
        self.metrics.add_gauge("used_bytes", "bytes the tier holds", self._used_bytes)
        self.metrics.add_gauge("pinned_keys", "keys pinned by leases now", self._pinned)
        self.metrics.add_gauge(
            "tier_down", "1 while the tier is skipped after failing (circuit open)", self._down
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
        return self._epoch

    def _changed(self) -> None:
        self._epoch = next(self._changes)

    def add_eviction_listener(self, listener: Callable[[str, bytes], None]) -> None:
        """Call ``listener(tier name, key)`` for every block a tier evicts (from the tier's
        thread, maybe under its lock: keep it short and never call back into the cache)."""
        self._eviction_listeners.append(listener)

    def tier_up(self, index: int) -> bool:
        """False while tier ``index`` is being skipped after a failure."""
        return self._breakers.up(index)

    # --- lookup --------------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes]) -> LookupResult:
        """The longest contiguous prefix of ``keys`` held by some tier, and which tier holds each.

        One ``contains_many`` per tier (only for keys not found in a faster tier).
        """
        return self._locate(keys, record=True)

    def _locate(self, keys: Sequence[bytes], record: bool) -> LookupResult:
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
            if not self.tier_up(t):
                continue
            asked = keys if pending is None else [keys[i] for i in pending]
            began = time.perf_counter()
            try:
                found = tier.contains_many(asked)
            except Exception as exc:
                self._failed(t, "contains", exc)
                continue
            self._succeeded(t)
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
        self, keys: Sequence[bytes], outs: Sequence, lookup: LookupResult | None = None
    ) -> LoadResult:
        """Read the leading hit chunks of ``keys`` into ``outs`` (one buffer per chunk).

        Stops at the first chunk no tier can serve (a miss, a bad block, a failing tier), so
        ``outs[:loaded]`` hold the prefix and nothing after it may be used. Pass the
        ``lookup`` just made to skip locating again. Chunks served by a slower tier are copied
        into the faster write-through tiers in the background (promotion).
        """
        start = time.perf_counter()
        found = lookup if lookup is not None else self._locate(keys, record=True)
        loc = found.tiers
        n = min(len(loc), len(outs), len(keys))
        served: list[int] = []
        headers: list[BlockHeader] = []
        corrupt = errors = skipped = 0
        i = 0
        while i < n:
            t = loc[i]
            j = i + 1
            while j < n and loc[j] == t:
                j += 1
            results = self._read(t, keys[i:j], outs[i:j])
            stopped = False
            for off, result in enumerate(results):
                at, header = t, result
                if not isinstance(result, BlockHeader):
                    skipped += result is _SKIPPED
                    c, e = self._account(t, keys[i + off], result)
                    corrupt, errors = corrupt + c, errors + e
                    at, header, c, e = self._read_fallback(t, keys[i + off], outs[i + off])
                    corrupt, errors = corrupt + c, errors + e
                    if header is None:
                        stopped = True
                        break
                served.append(at)
                headers.append(header)
            if stopped:
                break
            i = j
        nbytes = self._count_reads(served, headers)
        if headers:
            self._block_bytes = max(self._block_bytes, max(h.raw_len for h in headers))
        self._promote(keys, outs, served, headers)
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
            located=len(loc),
            skipped=skipped,
        )

    def _read(self, t: int, keys: Sequence[bytes], outs: Sequence) -> list:
        if not self.tier_up(t):
            return [_SKIPPED] * len(keys)
        began = time.perf_counter()
        try:
            results = self._tiers[t].get_many_into(keys, outs)
        except BufferTooSmallError:
            raise  # the caller's buffers are too small: a bug to fix, not a miss
        except Exception as exc:
            self._failed(t, "get", exc)
            return [_DOWN] * len(keys)
        self._succeeded(t)
        self.metrics.observe("read", t, time.perf_counter() - began, len(keys))
        return results

    def _read_fallback(
        self, failed: int, key: bytes, out
    ) -> tuple[int, BlockHeader | None, int, int]:
        """Try the tiers slower than ``failed`` for one chunk: (tier, header, corrupt, errors)."""
        corrupt = errors = 0
        for t in range(failed + 1, len(self._tiers)):
            if not self.tier_up(t):
                continue
            try:
                header = self._tiers[t].get_into(key, out)
            except BufferTooSmallError:
                raise
            except Exception as exc:
                header = exc if isinstance(exc, BlockError) else _DOWN
                if header is _DOWN:
                    self._failed(t, "get", exc)
            if isinstance(header, BlockHeader):
                return t, header, corrupt, errors
            if header is not None:
                c, e = self._account(t, key, header)
                corrupt, errors = corrupt + c, errors + e
        return -1, None, corrupt, errors

    def _account(self, t: int, key: bytes, result) -> tuple[int, int]:
        """Count a chunk tier ``t`` did not serve; queue a bad block's deletion."""
        if isinstance(result, BlockError):
            log.warning(
                "kvtier cache: bad block in tier %s (%s); deleting it", self.names[t], result
            )
            self.metrics.count(t, corrupt_blocks=1)
            self._writers[t].offer([WriteJob("delete", key)])
            return 1, 0
        if result is None:
            self.metrics.count(t, load_misses=1)
            return 0, 0
        return 0, 1  # the tier failed (already counted) or is being skipped

    def _count_reads(self, served: list[int], headers: list[BlockHeader]) -> int:
        per: dict[int, list[int]] = {}
        for t, header in zip(served, headers, strict=True):
            entry = per.setdefault(t, [0, 0])
            entry[0] += 1
            entry[1] += header.raw_len
        for t, (chunks, nbytes) in per.items():
            self.metrics.count(t, reads=chunks, bytes_read=nbytes)
        return sum(nbytes for _, nbytes in per.values())

    def _promote(
        self, keys: Sequence[bytes], outs: Sequence, served: list[int], headers: list[BlockHeader]
    ) -> None:
        jobs: dict[int, list[WriteJob]] = {}
        for ci, (src, header) in enumerate(zip(served, headers, strict=True)):
            targets = self._promote_into[src]
            if not targets:
                continue
            payload = bytes(memoryview(outs[ci]).cast("B")[: header.raw_len])
            job = WriteJob("promote", keys[ci], payload, header.meta)
            for u in targets:
                if self._admit(u, job.key, header.raw_len):
                    jobs.setdefault(u, []).append(job)
        for u, batch in jobs.items():
            self._enqueue(u, batch)

    # --- store ---------------------------------------------------------------------------
    def store(
        self,
        keys: Sequence[bytes],
        payloads: Sequence,
        meta: BlockMeta = RAW_META,
        copy: bool = True,
        values: Sequence[float] | None = None,
    ) -> int:
        """Queue ``payloads`` (one buffer per chunk) for every write-through tier; never waits.

        Returns how many leading chunks were queued (for the tier that took most); what a full
        queue cannot take is dropped and counted. With ``copy=False`` the caller promises not
        to change the buffers until :meth:`flush` returns. ``values`` (seconds of prefill each
        chunk saves) feed cost-aware eviction; they travel in each block's header.
        """
        if len(keys) != len(payloads):
            raise ValueError(f"store got {len(keys)} keys but {len(payloads)} payloads")
        if values is not None and len(values) != len(keys):
            raise ValueError(f"store got {len(keys)} keys but {len(values)} values")
        self.metrics.record_store(len(keys))
        if self._closed or not keys:
            return 0
        live = [t for t in self._through if self.tier_up(t)]
        for t in self._through:
            if t not in live:
                self.metrics.count(t, dropped_writes=len(keys))
        if not live:
            return 0
        take = min(len(keys), max(self._writers[t].room() for t in live))
        if copy:
            data = [bytes(memoryview(p).cast("B")) for p in payloads[:take]]
        else:
            data = list(payloads[:take])
        if data:
            self._block_bytes = max(self._block_bytes, memoryview(data[0]).nbytes)
        metas = [meta] * take if values is None else [replace(meta, value=v) for v in values[:take]]
        jobs = [
            WriteJob("store", k, p, m) for k, p, m in zip(keys[:take], data, metas, strict=True)
        ]
        accepted = 0
        for t in live:
            mine = jobs
            if self._opts[t].admission is not None:
                mine = [j for j in jobs if self._admit(t, j.key, memoryview(j.payload).nbytes)]
            got = self._writers[t].offer(mine)
            dropped = len(mine) - got + (len(keys) - take)
            if dropped:
                self.metrics.count(t, dropped_writes=dropped)
            accepted = max(accepted, got)
        return accepted

    def _enqueue(self, t: int, jobs: list[WriteJob]) -> int:
        if self._closed:
            return 0
        got = self._writers[t].offer(jobs) if self.tier_up(t) else 0
        if got < len(jobs):
            self.metrics.count(t, dropped_writes=len(jobs) - got)
        return got

    def _admit(self, t: int, key: bytes, size: int) -> bool:
        admission = self._opts[t].admission
        if admission is None:
            return True
        with self._admit_lock:
            ok = admission.admit(key, size)
        if not ok:
            self.metrics.count(t, not_admitted=1)
        return ok

    def _write(self, t: int, jobs: list[WriteJob]) -> None:
        """Writer thread of tier ``t``: apply one batch of queued jobs."""
        tier = self._tiers[t]
        puts = {j.key: j for j in jobs if j.kind != "delete"}  # one write per key per batch
        deletes = [j.key for j in jobs if j.kind == "delete"]
        if not self.tier_up(t):
            if puts:
                self.metrics.count(t, dropped_writes=len(puts))
            return
        if deletes:
            self._changed()
            try:
                tier.delete_many(deletes)
            except Exception as exc:
                self._failed(t, "delete", exc)
                return
        if not puts:
            return
        todo = list(puts.values())
        try:
            if self.config.skip_existing:
                present = tier.contains_many([j.key for j in todo])
                todo = [j for j, p in zip(todo, present, strict=True) if not p]
            if not todo:
                return
            began = time.perf_counter()
            done = tier.put_many([(j.key, j.payload, j.meta or RAW_META) for j in todo])
        except Exception as exc:
            self._failed(t, "put", exc)
            self.metrics.count(t, dropped_writes=len(todo))
            return
        self._succeeded(t)
        self.metrics.observe("write", t, time.perf_counter() - began, len(todo))
        written = [j for j, ok in zip(todo, done, strict=True) if ok]
        if written:
            self._changed()
        self.metrics.count(
            t,
            writes=len(written),
            bytes_written=sum(memoryview(j.payload).nbytes for j in written),
            promotions=sum(j.kind == "promote" for j in written),
            write_backs=sum(j.kind == "spill" for j in written),
            rejected_writes=len(todo) - len(written),
        )

    # --- tier events (called by tiers, possibly under their locks) -------------------------
    def _on_evicted(self, t: int, key: bytes) -> None:
        self.metrics.count(t, evictions=1)
        self._changed()
        for listener in self._eviction_listeners:
            try:
                listener(self.names[t], key)
            except Exception:  # a listener's bug must not fail the tier's write
                log.exception("kvtier cache: an eviction listener failed")

    def _on_spill(self, target: int, key: bytes, payload: memoryview, meta: BlockMeta) -> None:
        """The tier above ``target`` is about to evict ``key``: queue a copy for ``target``."""
        if self._closed:
            return
        writer = self._writers[target]
        if not self.tier_up(target) or writer.room() == 0:
            self.metrics.count(target, dropped_writes=1)
            return
        if not self._admit(target, key, payload.nbytes):
            return
        self._enqueue(target, [WriteJob("spill", key, bytes(payload), meta)])

    def _failed(self, t: int, op: str, exc: BaseException) -> None:
        """Open tier ``t``'s breaker: skip it for the back-off, doubled per failure in a row."""
        self.metrics.count(t, tier_errors=1)
        opened = self._breakers.failed(t)
        self._changed()
        if opened.first:
            self.metrics.count(t, tier_outages=1)
            log.warning(
                "kvtier cache: tier %s failed on %s (%s: %s); treating it as a miss for %.1f s",
                self.names[t],
                op,
                type(exc).__name__,
                exc,
                opened.wait_s,
            )

    def _succeeded(self, t: int) -> None:
        """Close tier ``t``'s breaker after an operation it answered."""
        if self._breakers.succeeded(t):
            self._changed()
            log.warning("kvtier cache: tier %s answers again", self.names[t])

    def _down(self):
        return [(self.names[i], 0.0 if self.tier_up(i) else 1.0) for i in range(len(self._tiers))]

    # --- prefetch and pins ----------------------------------------------------------------
    def prefetch(self, keys: Sequence[bytes]) -> Future[PrefetchResult]:
        """Bring the hit prefix of ``keys`` into the fastest tier in the background.

        The Future gives a :class:`PrefetchResult`; the chunks it reports ready are pinned for
        ``prefetch_pin_s`` so that a load right after finds them in the fastest tier.
        """
        if self._closed:
            done: Future[PrefetchResult] = Future()
            done.set_result(PrefetchResult(0, 0))
            return done
        return self._prefetcher.submit(self._prefetch, list(keys))

    def _prefetch(self, keys: list[bytes]) -> PrefetchResult:
        found = self._locate(keys, record=False)
        n = found.hit_chunks
        if n == 0:
            return PrefetchResult(0, 0)
        pin_s = self.config.prefetch_pin_s
        lease = self._leases.acquire(keys[:n], pin_s) if pin_s > 0 else None
        loc = found.tiers
        ready = promoted = 0
        i = 0
        while i < n:
            t = loc[i]
            j = i + 1
            while j < n and loc[j] == t:
                j += 1
            if t == 0:
                ready = j
                i = j
                continue
            if self._opts[0].write == "none" or not self.tier_up(0):
                break
            moved = self._copy_up(t, keys[i:j])
            promoted += moved
            ready = i + moved
            if moved < j - i:
                break
            i = j
        return PrefetchResult(ready, promoted, lease)

    def _copy_up(self, t: int, keys: Sequence[bytes]) -> int:
        """Read ``keys`` from tier ``t`` and put them in tier 0 now; how many leading made it."""
        size = self._block_bytes or _DEFAULT_BLOCK_BYTES
        while True:
            bufs = [bytearray(size) for _ in keys]
            try:
                results = self._read(t, keys, bufs)
                break
            except BufferTooSmallError:
                if size >= _MAX_BLOCK_BYTES:
                    return 0
                size *= 4
        moved = 0
        fast = self._tiers[0]
        for key, buf, header in zip(keys, bufs, results, strict=True):
            if not isinstance(header, BlockHeader):
                self._account(t, key, header)
                break
            self.metrics.count(t, reads=1, bytes_read=header.raw_len)
            self._block_bytes = max(self._block_bytes, header.raw_len)
            began = time.perf_counter()
            try:
                ok = fast.put(key, memoryview(buf)[: header.raw_len], header.meta)
            except Exception as exc:
                self._failed(0, "put", exc)
                break
            self.metrics.observe("write", 0, time.perf_counter() - began)
            if not ok:
                self.metrics.count(0, rejected_writes=1)
                break
            self.metrics.count(0, writes=1, bytes_written=header.raw_len, promotions=1)
            moved += 1
        if moved:
            self._changed()
        return moved

    def pin(self, keys: Sequence[bytes], ttl_s: float | None = None) -> Lease:
        """Keep ``keys`` from being evicted until the lease is released or ``ttl_s`` passes.

        ``ttl_s`` defaults to ``lease_ttl_s`` and is capped at ``max_lease_s``: nothing stays
        pinned forever. Tiers honour pins through :meth:`Tier.is_pinned`.
        """
        return self._leases.acquire(list(keys), ttl_s or self.config.lease_ttl_s)

    # --- life cycle ------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued writes (and the write-backs they cause) are done; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(2):  # a flushed faster tier may have spilled into a slower one
            for writer in self._writers:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not writer.flush(left):
                    return False
        return True

    def close(self, timeout: float | None = 10.0) -> None:
        """Finish queued writes (up to ``timeout``), stop the threads, unpin everything.

        The tiers stay open: whoever opened them closes them.
        """
        with self._close_lock:
            if self._closed:
                return
            self._prefetcher.shutdown(wait=True, cancel_futures=True)
            self.flush(timeout)
            self._closed = True
            for writer in self._writers:
                writer.close(timeout)
            for tier in self._tiers:
                tier.set_pinned(None)

    def __enter__(self) -> TieredCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TieredCache {' → '.join(self.names)}>"

    # --- gauges ------------------------------------------------------------------------------
    def _depths(self):
        return [(self.names[i], w.depth) for i, w in enumerate(self._writers)]

    def _used_bytes(self):
        out = []
        for i, tier in enumerate(self._tiers):
            if self.tier_up(i):
                try:
                    out.append((self.names[i], tier.usage().used_bytes))
                except Exception as exc:
                    self._failed(i, "usage", exc)
        return out

    def _pinned(self):
        return [("all", self._leases.pinned_keys())]


def _unique_names(tiers: Sequence[Tier]) -> tuple[str, ...]:
    names: list[str] = []
    for i, tier in enumerate(tiers):
        name = tier.name
        names.append(name if name not in names else f"{name}#{i}")
    return tuple(names)
