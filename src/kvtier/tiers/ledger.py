"""The books of one tier: which blocks it holds, how many bytes they take, who leaves first.

A :class:`BlockLedger` is what ``memory://``, ``file://`` and ``slab://`` keep their books in, and
what the simulator models a tier with. It holds the key → entry index (the entry is the tier's
own: slots, a file, a header), the size each block is charged, the eviction policy, the
tier-level admission and the byte accounting:

- ``used``: bytes of the blocks held, plus room reserved by writes in flight and room of blocks
  that left but cannot be given back yet (a reader still copies out of it);
- ``kept``: free room the tier keeps for reuse (kept files, free slots) that still counts
  against the capacity and can be reclaimed (a kept file deleted, a slot punched);
- ``limit``: the capacity, or less once the medium filled up first (:meth:`full`).

:meth:`make_room` is the one "make room, then evict" loop: reuse kept room of the exact size,
else fit within the limit, else reclaim kept room, else evict the policy's victim (spilled
first, when the tier has a spill callback). Evicted keys are collected and handed out by
:meth:`take_evicted`, so the tier notifies listeners after it releases its lock.

Pure: no I/O, no threads, no clock, no lock. The tier serialises calls under its own lock; the
index is a plain dict, so a reader may look a key up without that lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvtier.errors import ConfigError
from kvtier.policy.admission import AdmissionPolicy, FrequencyAdmission
from kvtier.policy.eviction import EvictionPolicy, make_policy

E = TypeVar("E")
R = TypeVar("R")
Pinned = Callable[[bytes], bool]


@dataclass(frozen=True)
class LedgerUsage:
    """A snapshot of the books."""

    used: int
    kept: int
    capacity: int
    limit: int
    blocks: int

    @property
    def free(self) -> int:
        """Bytes a write may take without reclaiming or evicting anything."""
        return max(0, self.limit - self.used - self.kept)


class BlockLedger(Generic[E]):
    """Index, byte accounting, eviction order and admission of one tier (see module docs)."""

    def __init__(
        self,
        capacity: int,
        eviction: str | EvictionPolicy = "lru",
        admission: AdmissionPolicy | None = None,
    ):
        if capacity <= 0:
            raise ConfigError(f"a tier's capacity must be positive, got {capacity}")
        self.index: dict[bytes, E] = {}
        self.sizes: dict[bytes, int] = {}
        self.policy: EvictionPolicy = (
            make_policy(eviction) if isinstance(eviction, str) else eviction
        )
        self.admission = admission
        self.capacity = capacity
        self.limit = capacity
        self.used = 0
        self.kept = 0
        self._evicted: list[bytes] = []

    @classmethod
    def admitting_after(
        cls, capacity: int, eviction: str | EvictionPolicy, admit_after: int
    ) -> BlockLedger:
        """A ledger whose tier admits a key on its ``admit_after``-th put (1: every put)."""
        if admit_after < 1:
            raise ConfigError(f"admit_after must be at least 1, got {admit_after}")
        admission = FrequencyAdmission(admit_after) if admit_after > 1 else None
        return cls(capacity, eviction, admission)

    # --- the index ---------------------------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        return key in self.index

    def __len__(self) -> int:
        return len(self.index)

    def get(self, key: bytes) -> E | None:
        """The entry of ``key``, or None."""
        return self.index.get(key)

    def admit(self, key: bytes, size: int, value: float = 0.0) -> bool:
        """Whether a put of ``key`` goes in: a held key always does; else the admission."""
        if self.admission is None or key in self.index:
            return True
        return self.admission.admit(key, size, value)

    def add(self, key: bytes, entry: E, size: int, value: float = 0.0) -> tuple[E, int] | None:
        """Book ``key``'s block in ``size`` bytes already counted in ``used`` (reserved by
        :meth:`make_room` or :meth:`reserve`). Returns the entry it replaces with its size,
        whose bytes stay counted until the caller :meth:`release`\\ s or :meth:`keep`\\ s them."""
        old = self.pop(key)
        self.index[key] = entry
        self.sizes[key] = size
        self.policy.insert(key, size, value)
        return old

    def adopt(self, key: bytes, entry: E, size: int, value: float = 0.0) -> tuple[E, int] | None:
        """Book a block found on the medium (a scan on open, another process's write): like
        :meth:`add`, counting its bytes now. May leave the books over the limit (see
        :meth:`shrink`)."""
        self.used += size
        return self.add(key, entry, size, value)

    def show(self, key: bytes, entry: E) -> tuple[E, int] | None:
        """List a block the tier serves but does not own (another writer's): in the index,
        never charged nor evicted. Returns the entry it replaces, as :meth:`add` does."""
        old = self.pop(key)
        self.index[key] = entry
        return old

    def pop(self, key: bytes) -> tuple[E, int] | None:
        """Unbook ``key`` (a delete): (entry, size), whose bytes stay counted until the caller
        :meth:`release`\\ s or :meth:`keep`\\ s them (size 0: a listed block); None when
        it is not held."""
        entry = self.index.pop(key, None)
        if entry is None:
            return None
        size = self.sizes.pop(key, None)
        if size is None:
            return entry, 0
        self.policy.remove(key)
        return entry, size

    def touch(self, key: bytes) -> None:
        """``key`` was read."""
        if key in self.index:
            self.policy.touch(key)

    def touch_many(self, keys: Iterable[bytes]) -> None:
        """The keys were read, in this order."""
        self.policy.touch_many(keys)

    def clear(self) -> None:
        """Forget everything (the tier closed)."""
        for key in list(self.index):
            self.policy.remove(key)
        self.index.clear()
        self.sizes.clear()
        self.used = self.kept = 0
        self._evicted.clear()

    # --- bytes -------------------------------------------------------------------------------
    def reserve(self, size: int) -> None:
        """Count ``size`` bytes as used (room taken outside :meth:`make_room`)."""
        self.used += size

    def release(self, size: int) -> None:
        """``size`` used bytes are free again (a failed write, a block's room given back)."""
        self.used -= size

    def keep(self, size: int) -> None:
        """``size`` bytes of free room are kept for reuse (they still count against the limit)."""
        self.kept += size

    def reclaimed(self, size: int) -> None:
        """``size`` bytes of kept room were given back to the medium or reused."""
        self.kept -= size

    def full(self) -> bool:
        """The medium ran out of room before the capacity: lower the limit to what is booked
        now, so later writes evict as they would at the capacity. True if it lowered it."""
        booked = self.used + self.kept
        if booked >= self.limit:
            return False
        self.limit = max(booked, 0)
        return True

    def set_limit(self, limit: int) -> None:
        """Set the limit (never above the capacity), e.g. when the medium has room again."""
        self.limit = max(0, min(limit, self.capacity))

    def usage(self) -> LedgerUsage:
        """The books now."""
        return LedgerUsage(self.used, self.kept, self.capacity, self.limit, len(self.index))

    # --- making room -------------------------------------------------------------------------
    def make_room(
        self,
        size: int,
        drop: Callable[[bytes, E, int], None],
        *,
        reuse: Callable[[int], R | None] | None = None,
        reclaim: Callable[[], int] | None = None,
        spill: Callable[[bytes, E], None] | None = None,
        pinned: Pinned | None = None,
    ) -> tuple[bool, R | None]:
        """Reserve ``size`` bytes for a write: (room?, the kept room ``reuse`` handed over).

        In order, until the write fits: kept room of this size (``reuse(size)``: the tier's
        token for it, or None), then free room within the limit, then kept room of other sizes
        given back (``reclaim()``: bytes it gave back, 0 when none), then the policy's victim
        not ``pinned``: ``spill(key, entry)`` first, then unbooked and ``drop(key, entry, size)``
        (the tier frees its room, or keeps it for reuse: it calls :meth:`release`, and
        :meth:`keep` for what it keeps, as after :meth:`pop`). No room: (False, None)."""
        if size > self.limit:
            return False, None
        while True:
            if reuse is not None:
                token = reuse(size)
                if token is not None:
                    self.kept -= size
                    self.used += size
                    return True, token
            if self.used + self.kept + size <= self.limit:
                self.used += size
                return True, None
            if not self.free_one(drop, reclaim=reclaim, spill=spill, pinned=pinned):
                return False, None

    def shrink(self, drop: Callable[[bytes, E, int], None], **hooks: Any) -> None:
        """Reclaim kept room, then evict, until the books fit within the limit: room for a
        write of nothing (``hooks``: :meth:`make_room`'s ``reclaim``, ``spill``, ``pinned``)."""
        self.make_room(0, drop, **hooks)

    def free_one(
        self,
        drop: Callable[[bytes, E, int], None],
        *,
        reclaim: Callable[[], int] | None = None,
        spill: Callable[[bytes, E], None] | None = None,
        pinned: Pinned | None = None,
    ) -> bool:
        """Reclaim one piece of kept room, else evict one block (see :meth:`make_room`); False
        when neither can."""
        if self.kept and reclaim is not None:
            given = reclaim()
            if given > 0:
                self.kept -= given
                return True
        return self.evict_one(drop, spill=spill, pinned=pinned)

    def evict_one(
        self,
        drop: Callable[[bytes, E, int], None],
        *,
        spill: Callable[[bytes, E], None] | None = None,
        pinned: Pinned | None = None,
    ) -> bool:
        """Evict the policy's next victim not ``pinned`` (see :meth:`make_room`); False when
        there is none."""
        victim = self.policy.victim(pinned)
        if victim is None:
            return False
        entry = self.index.get(victim)
        if entry is None:  # the policy knew a key the index lost: forget it
            self.policy.remove(victim)
            return True
        if spill is not None:
            spill(victim, entry)
        self.policy.remove(victim)  # first: the policy sees the eviction of the key it named
        del self.index[victim]
        drop(victim, entry, self.sizes.pop(victim))
        self._evicted.append(victim)
        return True

    def take_evicted(self) -> list[bytes]:
        """The keys evicted since the last call (to notify once the tier's lock is released)."""
        out, self._evicted = self._evicted, []
        return out


__all__ = ["BlockLedger", "LedgerUsage"]
