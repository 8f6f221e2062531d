"""A slab arena: fixed-size slots carved from a few large preallocated buffers, reused forever.

The memory tier stores every block in slots of one size; a block larger than a slot takes
several (not necessarily adjacent) slots. Buffers are mapped in chunks as the tier fills, up to
the capacity, pre-faulted, and never returned: a put reuses a freed slot instead of allocating.
With ``pinned`` the chunks are page-locked host memory from torch (for fast device copies).
The arena is not thread-safe; its owner serializes ``alloc``/``free``.
"""

from __future__ import annotations

import sys

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
        self._free: list[int] = []
        self._mapped = 0  # slots carved so far

    @property
    def free_slots(self) -> int:
        """Slots that ``alloc`` can hand out now (free ones plus those not yet mapped)."""
        return len(self._free) + self.slots - self._mapped

    @property
    def held_slots(self) -> int:
        """Slots handed out and not freed."""
        return self._mapped - len(self._free)

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
        self._mapped += n
        self._free.extend(range(first + n - 1, first - 1, -1))  # pop() hands out in order

    def alloc(self, n: int) -> list[int] | None:
        """``n`` slots, or None (nothing taken) when fewer are free."""
        if n > self.free_slots:
            return None
        while len(self._free) < n:
            self._grow()
        return [self._free.pop() for _ in range(n)]

    def free(self, slots: list[int]) -> None:
        """Give slots back for reuse."""
        self._free.extend(reversed(slots))

    def span(self, slots: list[int]) -> np.ndarray | None:
        """One view of ``slots`` when they are consecutive in one chunk (else None): a block
        over several slots that lie back to back is one buffer, read with one copy."""
        first, n = slots[0], len(slots)
        if any(s != first + k for k, s in enumerate(slots)):
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
