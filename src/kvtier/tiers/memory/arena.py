"""A slab arena: fixed-size slots carved from a few large preallocated buffers, reused forever.

The memory tier stores every block in slots of one size; a block larger than a slot takes
several, consecutive where a free run of them is long enough (the smallest such run, so long
runs stay whole): then the block is one buffer, copied in and out in one piece, and its slots
are a ``range`` (a block's slots cost the same to hand out, free and view however many they
are). Buffers are
mapped in chunks as the tier fills, up to the capacity, pre-faulted, and never returned: a put
reuses freed slots instead of allocating.
With ``pinned`` the chunks are page-locked host memory from torch (for fast device copies).
The arena is not thread-safe; its owner serializes ``alloc``/``free``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from kvtier.errors import ConfigError
from kvtier.tiers.io.buffers import aligned_array

CHUNK_BYTES = 64 << 20


def pinned_available() -> bool:
    """Whether torch is already imported and has CUDA (pinned memory then pays off)."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_available())
    except Exception:
        return False


def _pinned_array(nbytes: int, keep: list) -> np.ndarray:
    import torch  # only reached when pinned memory was asked for and is available

    tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    keep.append(tensor)  # the array below borrows the tensor's memory
    return tensor.numpy()


class SlabArena:
    """``capacity // slot_size`` slots of ``slot_size`` bytes, allocated in chunks on demand."""

    def __init__(self, capacity: int, slot_size: int, pinned: bool = False):
        if slot_size <= 0:
            raise ConfigError(f"slot size must be positive, got {slot_size}")
        self.slot_size = slot_size
        self.slots = capacity // slot_size
        self.pinned = pinned
        self.per_chunk = max(1, min(self.slots, CHUNK_BYTES // slot_size))
        self._chunks: list[np.ndarray] = []
        self._tensors: list = []
        self._is_free = np.zeros(self.slots, bool)  # by slot, over the mapped ones
        self._nfree = 0
        # free slots to hand out one at a time (pop() gives them in order); an entry whose
        # slot a run took since is stale, and skipped
        self._stack: list[int] = []
        # runs freed lately, last on top: the next block of the same size takes the top one
        # whole, without a search (an entry a later alloc took part of is stale, and skipped)
        self._freed_runs: list[range] = []
        self._mapped = 0  # slots carved so far

    @property
    def free_slots(self) -> int:
        """Slots that ``alloc`` can hand out now (free ones plus those not yet mapped)."""
        return self._nfree + self.slots - self._mapped

    @property
    def held_slots(self) -> int:
        """Slots handed out and not freed."""
        return self._mapped - self._nfree

    @property
    def mapped_bytes(self) -> int:
        """Bytes of memory the arena holds (its chunks)."""
        return sum(c.nbytes for c in self._chunks)

    def _grow(self) -> None:
        n = min(self.per_chunk, self.slots - self._mapped)
        nbytes = n * self.slot_size
        chunk = _pinned_array(nbytes, self._tensors) if self.pinned else aligned_array(nbytes)
        self._chunks.append(chunk)
        first = self._mapped
        self._is_free[first : first + n] = True
        self._stack.extend(range(first + n - 1, first - 1, -1))
        self._mapped += n
        self._nfree += n

    def _run(self, n: int) -> int | None:
        """The first slot of the smallest free run of at least ``n`` slots within one chunk."""
        rows, per = -(-self._mapped // self.per_chunk), self.per_chunk
        inner = np.zeros(rows * per, np.int8)
        inner[: self._mapped] = self._is_free[: self._mapped]
        grid = np.zeros((rows, per + 2), np.int8)  # a taken slot either side of each chunk
        grid[:, 1:-1] = inner.reshape(rows, per)
        edges = np.diff(grid.ravel())
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        lengths = ends - starts
        fits = np.flatnonzero(lengths >= n)
        if not fits.size:
            return None
        row, col = divmod(int(starts[fits[np.argmin(lengths[fits])]]), per + 2)
        return row * per + col

    def _top_run(self, n: int) -> range | None:
        """The run freed last, when it has ``n`` slots (a block that just left frees such a
        run, which the next block of its size reuses); runs taken apart since are dropped."""
        runs, is_free = self._freed_runs, self._is_free
        while runs:
            run = runs[-1]
            if not is_free[run.start : run.stop].all():
                runs.pop()
            elif len(run) == n:
                return runs.pop()
            else:
                return None
        return None

    def _pop(self) -> int:
        while True:
            slot = self._stack.pop()
            if self._is_free[slot]:
                return slot

    def alloc(self, n: int) -> Sequence[int] | None:
        """``n`` slots, or None (nothing taken) when fewer are free: one run of consecutive
        slots (a ``range``) when there is one, mapping a new chunk for it while the arena can
        grow; else a list of free slots wherever they are."""
        if n > self.free_slots:
            return None
        while self._nfree < n:
            self._grow()
        run = None
        if n > 1:
            run = self._top_run(n)
            first = self._run(n) if run is None else run.start
            while first is None and n <= self.per_chunk and self._mapped < self.slots:
                self._grow()
                first = self._run(n)
            if first is not None:
                run = range(first, first + n)
        self._nfree -= n
        if run is not None:
            self._is_free[run.start : run.stop] = False
            return run
        slots = []
        for _ in range(n):
            slots.append(self._pop())
            self._is_free[slots[-1]] = False
        return slots

    def free(self, slots: Sequence[int]) -> None:
        """Give slots back for reuse."""
        if type(slots) is range:
            self._is_free[slots.start : slots.stop] = True
            self._freed_runs.append(slots)
            if len(self._freed_runs) > self._mapped // 2 + 64:  # more than can be free
                del self._freed_runs[: len(self._freed_runs) // 2]
        else:
            self._is_free[slots] = True
        self._nfree += len(slots)
        self._stack.extend(reversed(slots))
        if len(self._stack) > 2 * self._mapped + 64:  # drop the stale entries
            self._stack = np.flatnonzero(self._is_free[: self._mapped])[::-1].tolist()

    def span(self, slots: Sequence[int]) -> np.ndarray | None:
        """One view of ``slots`` when they are consecutive in one chunk (else None): a block
        over several slots that lie back to back is one buffer, read with one copy."""
        first, n = slots[0], len(slots)
        if type(slots) is not range and any(s != first + k for k, s in enumerate(slots)):
            return None
        chunk, i = divmod(first, self.per_chunk)
        if i + n > self.per_chunk:
            return None
        start = i * self.slot_size
        return self._chunks[chunk][start : start + n * self.slot_size]

    def view(self, slot: int) -> np.ndarray:
        """The bytes of one slot."""
        chunk, i = divmod(slot, self.per_chunk)
        start = i * self.slot_size
        return self._chunks[chunk][start : start + self.slot_size]
