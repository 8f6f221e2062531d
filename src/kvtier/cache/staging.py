"""Host buffers for the chunks a caller copies out and hands to the cache's writers.

A fresh large buffer per stored chunk is fresh pages: faulting them in costs more than the copy
into them, on the thread that copies (the engine's). A :class:`StagingPool` lends buffers that
are already faulted in and takes them back through ``TieredCache.store(..., release=pool.give)``
once the writers are done with them. Given a lender (the cache's first tier, where it is a
``memory://`` tier storing raw blocks: :meth:`~kvtier.cache.TieredCache.lender`), the buffers
are slots of that tier's arena: the chunk is copied once, into the place it is stored.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from kvtier.tiers.io.buffers import aligned_array

#: Idle buffers a pool keeps by default, in bytes (at least ``least`` buffers: see ``within``).
KEEP_BYTES = 256 << 20


class Lender(Protocol):
    """A tier that lends buffers which a put of them stores in place (``MemoryTier``)."""

    def lend(self, nbytes: int) -> np.ndarray | None: ...

    def unlend(self, buf: object) -> bool: ...


class StagingPool:
    """uint8 buffers of ``nbytes`` each: the ``lender``'s while it has room, else page-aligned
    ones of the pool's own, of which at most ``keep`` idle ones are kept. Thread-safe."""

    def __init__(self, nbytes: int, keep: int, lender: Lender | None = None) -> None:
        if nbytes < 1 or keep < 0:
            raise ValueError(f"a staging pool needs nbytes ≥ 1 and keep ≥ 0, got {nbytes}, {keep}")
        self.nbytes = nbytes
        self.keep = keep
        self.lender = lender
        self._idle: list[np.ndarray] = []
        self._lock = threading.Lock()

    @classmethod
    def within(
        cls, nbytes: int, budget: int = KEEP_BYTES, least: int = 4, lender: Lender | None = None
    ) -> StagingPool:
        """A pool keeping as many idle buffers as ``budget`` bytes hold (at least ``least``)."""
        return cls(nbytes, max(least, budget // max(nbytes, 1)), lender)

    def take(self, n: int) -> list[np.ndarray]:
        """``n`` buffers: lent ones first, then idle ones, then new ones."""
        got: list[np.ndarray] = []
        while self.lender is not None and len(got) < n:
            buf = self.lender.lend(self.nbytes)
            if buf is None:
                break
            got.append(buf)
        with self._lock:
            while len(got) < n and self._idle:
                got.append(self._idle.pop())
        return got + [aligned_array(self.nbytes) for _ in range(n - len(got))]

    def give(self, buf: object) -> None:
        """Take back a buffer from :meth:`take`: a lent one goes back to its lender; one of the
        pool's own is kept while fewer than ``keep`` are idle."""
        if self.lender is not None and self.lender.unlend(buf):
            return
        if not isinstance(buf, np.ndarray) or buf.nbytes != self.nbytes:
            return  # not one of ours: left to the garbage collector
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(buf)

    @property
    def idle(self) -> int:
        """The pool's own buffers waiting to be lent."""
        return len(self._idle)
