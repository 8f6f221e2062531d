"""The cache's write side: stores, promotions, write-backs and deletes, queued per tier.

Each tier has one writer thread draining a bounded queue (``workers``); nothing here waits for
a tier. What a full queue, a skipped tier or an admission policy refuses is dropped and counted.
A write-back tier receives the blocks the tier above it is about to evict (spill).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from kvtier.cache.config import CacheConfig, TierOptions
from kvtier.cache.guard import TierGuard
from kvtier.cache.workers import Hold, TierWriter, WriteJob
from kvtier.codec import BlockMeta
from kvtier.codec.container import RAW_META

log = logging.getLogger("kvtier.cache")

#: Hears what a writer thread did to tier ``t``: the keys now stored there, the keys deleted.
WriteListener = Callable[[int, list[bytes], list[bytes]], None]


class Writes:
    """One writer per tier of ``guard``, with each tier's admission (``opts``)."""

    def __init__(self, guard: TierGuard, opts: Sequence[TierOptions], config: CacheConfig):
        self._guard = guard
        self._opts = tuple(opts)
        self._skip_existing = config.skip_existing
        self._admit_lock = threading.Lock()
        self._closed = False
        self.listeners: list[WriteListener] = []
        self.through = [i for i, o in enumerate(self._opts) if o.write == "through"]
        self._writers = [
            TierWriter(
                guard.names[i],
                config.queue_chunks,
                config.write_batch,
                functools.partial(self._write, i),
            )
            for i in range(len(guard.tiers))
        ]

    @property
    def closed(self) -> bool:
        """True once :meth:`close` began: nothing more is queued."""
        return self._closed

    def depths(self) -> list[tuple[str, int]]:
        """(tier name, jobs waiting) per tier."""
        return [(self._guard.names[i], w.depth) for i, w in enumerate(self._writers)]

    # --- queueing --------------------------------------------------------------------------
    def store(
        self,
        keys: Sequence[bytes],
        payloads: Sequence,
        meta: BlockMeta,
        copy: bool,
        values: Sequence[float] | None,
        release: Callable[[object], None] | None = None,
    ) -> int:
        """Queue the chunks for every live write-through tier; how many leading ones were taken
        (for the tier that took most). ``release(payload)`` runs once for every payload, as soon
        as no writer needs it (at once for what is copied or not queued)."""
        guard, metrics = self._guard, self._guard.metrics
        lent = release is not None and not copy
        live: list[int] = []
        if keys and not self._closed:
            live = [t for t in self.through if guard.up(t)]
            for t in self.through:
                if t not in live:
                    metrics.count(t, dropped_writes=len(keys))
        take = min(len(keys), max(self._writers[t].room() for t in live)) if live else 0
        if copy:
            data = [bytes(memoryview(p).cast("B")) for p in payloads[:take]]
        else:
            data = list(payloads[:take])
        if release is not None:  # what no writer will hold
            for p in payloads if copy else payloads[take:]:
                release(p)
        if not take:
            return 0
        guard.saw_block(memoryview(data[0]).nbytes)
        metas = [meta] * take if values is None else [replace(meta, value=v) for v in values[:take]]
        holds = [Hold(p, release, len(live)) if lent else None for p in data]
        jobs = [
            WriteJob("store", k, p, m, h)
            for k, p, m, h in zip(keys[:take], data, metas, holds, strict=True)
        ]
        accepted = 0
        for t in live:
            mine = jobs
            if self._opts[t].admission is not None:
                mine = [j for j in jobs if self.admit(t, j.key, memoryview(j.payload).nbytes)]
            got = self._writers[t].offer(mine)
            dropped = len(mine) - got + (len(keys) - take)
            if dropped:
                metrics.count(t, dropped_writes=dropped)
            accepted = max(accepted, got)
            if lent:  # this tier's writer will not hold what it refused
                queued = {id(j) for j in mine[:got]}
                for job, hold in zip(jobs, holds, strict=True):
                    if hold is not None and id(job) not in queued:
                        hold.drop()
        return accepted

    def enqueue(self, t: int, jobs: list[WriteJob]) -> int:
        """Queue ``jobs`` for tier ``t`` (unless it is skipped); count what does not fit."""
        if self._closed:
            return 0
        got = self._writers[t].offer(jobs) if self._guard.up(t) else 0
        if got < len(jobs):
            self._guard.metrics.count(t, dropped_writes=len(jobs) - got)
        return got

    def discard(self, t: int, key: bytes) -> None:
        """Queue the deletion of ``key`` from tier ``t`` (a bad block)."""
        self._writers[t].offer([WriteJob("delete", key)])

    def admit(self, t: int, key: bytes, size: int) -> bool:
        """Whether tier ``t``'s admission policy takes the block (True without one)."""
        admission = self._opts[t].admission
        if admission is None:
            return True
        with self._admit_lock:
            ok = admission.admit(key, size)
        if not ok:
            self._guard.metrics.count(t, not_admitted=1)
        return ok

    def spill(self, target: int, key: bytes, payload: memoryview, meta: BlockMeta) -> None:
        """The tier above ``target`` is about to evict ``key``: queue a copy for ``target``."""
        if self._closed:
            return
        writer = self._writers[target]
        if not self._guard.up(target) or writer.room() == 0:
            self._guard.metrics.count(target, dropped_writes=1)
            return
        if not self.admit(target, key, payload.nbytes):
            return
        self.enqueue(target, [WriteJob("spill", key, bytes(payload), meta)])

    # --- the writer threads ----------------------------------------------------------------
    def _write(self, t: int, jobs: list[WriteJob]) -> None:
        """Writer thread of tier ``t``: apply one batch of queued jobs."""
        guard, metrics = self._guard, self._guard.metrics
        tier = guard.tiers[t]
        puts = {j.key: j for j in jobs if j.kind != "delete"}  # one write per key per batch
        deletes = [j.key for j in jobs if j.kind == "delete"]
        if not guard.up(t):
            if puts:
                metrics.count(t, dropped_writes=len(puts))
            return
        if deletes:
            guard.changed()
            try:
                gone = tier.delete_many(deletes)
            except Exception as exc:
                guard.failed(t, "delete", exc)
                return
            self.tell(t, [], [k for k, g in zip(deletes, gone, strict=True) if g])
        if not puts:
            return
        todo = list(puts.values())
        held: list[bytes] = []  # already there (skip_existing): stored all the same
        try:
            if self._skip_existing:
                present = tier.contains_many([j.key for j in todo])
                held = [j.key for j, p in zip(todo, present, strict=True) if p]
                todo = [j for j, p in zip(todo, present, strict=True) if not p]
            if not todo:
                self.tell(t, held, [])
                return
            began = time.perf_counter()
            done = tier.put_many([(j.key, j.payload, j.meta or RAW_META) for j in todo])
        except Exception as exc:
            guard.failed(t, "put", exc)
            metrics.count(t, dropped_writes=len(todo))
            return
        guard.succeeded(t)
        metrics.observe("write", t, time.perf_counter() - began, len(todo))
        written = [j for j, ok in zip(todo, done, strict=True) if ok]
        if written:
            guard.changed()
        self.tell(t, held + [j.key for j in written], [])
        metrics.count(
            t,
            writes=len(written),
            bytes_written=sum(memoryview(j.payload).nbytes for j in written),
            promotions=sum(j.kind == "promote" for j in written),
            write_backs=sum(j.kind == "spill" for j in written),
            rejected_writes=len(todo) - len(written),
        )

    def tell(self, t: int, stored: list[bytes], deleted: list[bytes]) -> None:
        """Tell the listeners what is now stored in (or deleted from) tier ``t``."""
        if not (stored or deleted):
            return
        for listener in self.listeners:
            try:
                listener(t, stored, deleted)
            except Exception:  # a listener's bug must not stop the writer
                log.exception("kvtier cache: a write listener failed")

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

    def close(self, timeout: float | None) -> None:
        """Take nothing more and stop the writer threads (each finishes up to ``timeout``)."""
        self._closed = True
        for writer in self._writers:
            writer.close(timeout)


__all__ = ["Writes"]
