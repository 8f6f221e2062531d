"""Copying blocks into faster tiers: promotion after a load, and prefetch ahead of one.

After a load, each chunk a slower tier served is queued for the faster write-through tiers
that promote (in the background, through their writers). A prefetch brings a request's hit
prefix into the fastest tier now, on a small pool of its own, and pins it for a while so that
the load that follows finds it there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from kvtier.cache.config import CacheConfig, TierOptions
from kvtier.cache.guard import TierGuard
from kvtier.cache.leases import LeaseTable
from kvtier.cache.results import LookupResult, PrefetchResult
from kvtier.cache.workers import WriteJob
from kvtier.cache.writes import Writes
from kvtier.codec import BlockHeader, BufferTooSmallError

_DEFAULT_BLOCK_BYTES = 1 << 20
_MAX_BLOCK_BYTES = 1 << 31


class Promoter:
    """Promotion and prefetch over ``guard``'s tiers; ``locate(keys)`` finds where keys live
    (without counting it as a lookup)."""

    def __init__(
        self,
        guard: TierGuard,
        writes: Writes,
        opts: Sequence[TierOptions],
        leases: LeaseTable,
        config: CacheConfig,
        locate: Callable[[Sequence[bytes]], LookupResult],
    ):
        self._guard = guard
        self._writes = writes
        self._leases = leases
        self._locate = locate
        self._pin_s = config.prefetch_pin_s
        self._fast_written = opts[0].write != "none"
        self._into = [
            [u for u in range(t) if opts[u].write == "through" and opts[u].promote]
            for t in range(len(opts))
        ]
        self._closed = False
        self._pool = ThreadPoolExecutor(
            config.prefetch_workers, thread_name_prefix="kvtier-prefetch"
        )

    # --- promotion -------------------------------------------------------------------------
    def promote(
        self, keys: Sequence[bytes], outs: Sequence, served: list[int], headers: list[BlockHeader]
    ) -> None:
        """Queue the chunks that ``served[i]`` (a tier index) read into ``outs[i]`` for the
        faster tiers that take promotions."""
        jobs: dict[int, list[WriteJob]] = {}
        for ci, (src, header) in enumerate(zip(served, headers, strict=True)):
            targets = self._into[src]
            if not targets:
                continue
            payload = bytes(memoryview(outs[ci]).cast("B")[: header.raw_len])
            job = WriteJob("promote", keys[ci], payload, header.meta)
            for u in targets:
                if self._writes.admit(u, job.key, header.raw_len):
                    jobs.setdefault(u, []).append(job)
        for u, batch in jobs.items():
            self._writes.enqueue(u, batch)

    # --- prefetch --------------------------------------------------------------------------
    def prefetch(self, keys: Sequence[bytes]) -> Future[PrefetchResult]:
        """Bring the hit prefix of ``keys`` into the fastest tier in the background."""
        if self._closed:
            done: Future[PrefetchResult] = Future()
            done.set_result(PrefetchResult(0, 0))
            return done
        return self._pool.submit(self._prefetch, list(keys))

    def _prefetch(self, keys: list[bytes]) -> PrefetchResult:
        found = self._locate(keys)
        n = found.hit_chunks
        if n == 0:
            return PrefetchResult(0, 0)
        lease = self._leases.acquire(keys[:n], self._pin_s) if self._pin_s > 0 else None
        ready = promoted = 0
        for t, i, j in found.runs():
            if t == 0:
                ready = j
                continue
            if not self._fast_written or not self._guard.up(0):
                break
            moved = self._copy_up(t, keys[i:j])
            promoted += moved
            ready = i + moved
            if moved < j - i:
                break
        return PrefetchResult(ready, promoted, lease)

    def _copy_up(self, t: int, keys: Sequence[bytes]) -> int:
        """Read ``keys`` from tier ``t`` and put them in tier 0 now; how many leading made it."""
        guard, metrics = self._guard, self._guard.metrics
        size = guard.largest_block or _DEFAULT_BLOCK_BYTES
        while True:
            bufs = [bytearray(size) for _ in keys]
            try:
                results = guard.read(t, keys, bufs)
                break
            except BufferTooSmallError:
                if size >= _MAX_BLOCK_BYTES:
                    return 0
                size *= 4
        moved = 0
        fast = guard.tiers[0]
        for key, buf, header in zip(keys, bufs, results, strict=True):
            if not isinstance(header, BlockHeader):
                guard.account(t, key, header)
                break
            metrics.count(t, reads=1, bytes_read=header.raw_len)
            guard.saw_block(header.raw_len)
            began = time.perf_counter()
            try:
                ok = fast.put(key, memoryview(buf)[: header.raw_len], header.meta)
            except Exception as exc:
                guard.failed(0, "put", exc)
                break
            metrics.observe("write", 0, time.perf_counter() - began)
            if not ok:
                metrics.count(0, rejected_writes=1)
                break
            metrics.count(0, writes=1, bytes_written=header.raw_len, promotions=1)
            moved += 1
        if moved:
            guard.changed()
            self._writes.tell(0, list(keys[:moved]), [])  # written here, not by a writer thread
        return moved

    def close(self) -> None:
        """Take no more prefetches; wait for the running ones, cancel the queued ones."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["Promoter"]
