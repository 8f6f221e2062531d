"""Reusable host buffers for the chunks a caller copies out and hands to the cache's writers.

A fresh large buffer per stored chunk is fresh pages: faulting them in costs more than the copy
into them, on the thread that copies (the engine's). A pool lends buffers of one size, already
faulted in, and takes them back through ``TieredCache.store(..., release=pool.give)`` once the
writers are done with them.
"""

from __future__ import annotations

import threading

import numpy as np

from kvtier.tiers.io.buffers import aligned_array

#: Idle buffers a pool keeps by default, in bytes (at least ``least`` buffers: see ``within``).
KEEP_BYTES = 256 << 20


class StagingPool:
    """Page-aligned uint8 buffers of ``nbytes`` each; at most ``keep`` idle ones are kept
    (more in flight are allocated and later dropped). Thread-safe."""

    def __init__(self, nbytes: int, keep: int) -> None:
        if nbytes < 1 or keep < 0:
            raise ValueError(f"a staging pool needs nbytes ≥ 1 and keep ≥ 0, got {nbytes}, {keep}")
        self.nbytes = nbytes
        self.keep = keep
        self._idle: list[np.ndarray] = []
        self._lock = threading.Lock()

    @classmethod
    def within(cls, nbytes: int, budget: int = KEEP_BYTES, least: int = 4) -> StagingPool:
        """A pool keeping as many idle buffers as ``budget`` bytes hold (at least ``least``)."""
        return cls(nbytes, max(least, budget // max(nbytes, 1)))

    def take(self, n: int) -> list[np.ndarray]:
        """``n`` buffers, idle ones first."""
        with self._lock:
            got = [self._idle.pop() for _ in range(min(n, len(self._idle)))]
        return got + [aligned_array(self.nbytes) for _ in range(n - len(got))]

    def give(self, buf: object) -> None:
        """Take back a buffer from :meth:`take` (kept while fewer than ``keep`` are idle)."""
        if not isinstance(buf, np.ndarray) or buf.nbytes != self.nbytes:
            return  # not one of ours: left to the garbage collector
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(buf)

    @property
    def idle(self) -> int:
        """Buffers waiting to be lent."""
        return len(self._idle)
