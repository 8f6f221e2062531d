"""The memory reference: plain copies between preallocated buffers, driven like a tier pass.

A "read" copies block ``i`` of a pre-touched pool into the worker's output buffer (what a
memory tier's ``get_into`` must do at least); a "write" copies the worker's payload into block
``i`` of the pool. ``numpy.copyto`` releases the GIL, so threads copy in parallel.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np

from kvtier.bench.driver import PassPlan, run_pass
from kvtier.bench.stats import PassResult

PAGE = 4096


def aligned_empty(nbytes: int) -> np.ndarray:
    """A page-aligned, pre-faulted uint8 array of ``nbytes`` on plain 4 KiB pages.

    Engines hand page-aligned buffers to the cache, and an O_DIRECT tier reads straight into
    them. Anonymous ``mmap`` without ``MADV_HUGEPAGE`` gives the same kind of memory as fio's
    own I/O buffers, so neither side of a comparison gets larger pages (fewer, larger device
    requests) than the other.
    """
    size = max(PAGE, -(-nbytes // PAGE) * PAGE)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, size, flags=flags), dtype=np.uint8, count=nbytes)


def aligned_full(nbytes: int, value: int) -> np.ndarray:
    """``aligned_empty`` filled with ``value`` (every page touched)."""
    out = aligned_empty(nbytes)
    out.fill(value)
    return out


class WorkerBuffers:
    """``batch`` preallocated, pre-touched block buffers per thread, grown on demand."""

    def __init__(self, item_bytes: int, batch: int, fill: int = 2):
        self.item_bytes = item_bytes
        self.batch = batch
        self.fill = fill
        self._buffers: list[list[np.ndarray]] = []

    def ensure(self, threads: int) -> list[list[np.ndarray]]:
        """Buffers for at least ``threads`` threads."""
        while len(self._buffers) < threads:
            self._buffers.append(
                [aligned_full(self.item_bytes, self.fill) for _ in range(self.batch)]
            )
        return self._buffers

    def clear(self) -> None:
        """Free every buffer."""
        self._buffers = []


class CopyReference:
    """A pool of ``items`` blocks of ``item_bytes`` plus per-thread buffers."""

    def __init__(self, items: int, item_bytes: int, batch: int = 1):
        stride = -(-item_bytes // PAGE) * PAGE  # every block starts on a page, like a tier slot
        self.pool = aligned_full(items * stride, 1).reshape(items, stride)[:, :item_bytes]
        self.buffers = WorkerBuffers(item_bytes, batch)

    def _buffers_for(self, plan: PassPlan) -> list[list[np.ndarray]]:
        """``plan.batch`` buffers for each of the plan's threads."""
        if self.buffers.batch < plan.batch:
            self.buffers = WorkerBuffers(self.buffers.item_bytes, plan.batch, self.buffers.fill)
        return self.buffers.ensure(plan.threads)

    def read(self, plan: PassPlan) -> PassResult:
        """Copy pool blocks into the threads' buffers."""
        return self._copy(plan, into_pool=False)

    def write(self, plan: PassPlan) -> PassResult:
        """Copy the threads' buffers into pool blocks."""
        return self._copy(plan, into_pool=True)

    def _copy(self, plan: PassPlan, into_pool: bool) -> PassResult:
        """One pass of copies between each planned pool block and its thread's buffer, into the
        pool (a write) or out of it (a read)."""
        pool, buffers = self.pool, self._buffers_for(plan)

        def work(worker: int, indices: Sequence[int]) -> None:
            own = buffers[worker]
            for j, i in enumerate(indices):
                dst, src = (pool[i], own[j]) if into_pool else (own[j], pool[i])
                np.copyto(dst, src)

        return run_pass(plan, work)

    def close(self) -> None:
        """Free the pool and the buffers."""
        self.pool = np.empty((0, 0), dtype=np.uint8)
        self.buffers.clear()
