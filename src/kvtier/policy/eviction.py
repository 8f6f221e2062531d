"""Eviction policies: which held block goes first when a tier needs room.

A policy tracks keys only; the tier owns the bytes. Contract: ``insert`` a new key, ``touch`` on
every hit, ``remove`` when the tier drops a key for any reason, ``victim`` names the next key to
drop without removing it, skipping keys the optional ``pinned`` predicate holds (a tier passes
its :meth:`~kvtier.tiers.base.Tier.is_pinned`). Removing the key ``victim`` just named counts as
an eviction (ARC keeps a ghost of it, cost-aware ages its clock); removing another key is a plain
delete. Policies are not thread-safe: the tier calls them under its own lock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Protocol

Pinned = Callable[[bytes], bool]


class EvictionPolicy(Protocol):
    """Orders the keys a tier holds by who leaves first."""

    def insert(self, key: bytes, size: int, value: float = 0.0) -> None:
        """A new block arrived (``value``: seconds of prefill it saves, for cost-aware policies)."""
        ...

    def touch(self, key: bytes) -> None:
        """The block was read."""
        ...

    def touch_many(self, keys: Iterable[bytes]) -> None:
        """The blocks were read, in this order (keys the policy does not hold are skipped)."""
        ...

    def remove(self, key: bytes) -> None:
        """The block left the tier (evicted or deleted)."""
        ...

    def victim(self, pinned: Pinned | None = None) -> bytes | None:
        """The key to evict next that ``pinned`` does not hold, or None when there is none."""
        ...

    def __len__(self) -> int: ...


class LRU:
    """Least recently used first."""

    def __init__(self) -> None:
        self._order: OrderedDict[bytes, None] = OrderedDict()

    def insert(self, key: bytes, size: int, value: float = 0.0) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: bytes) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def touch_many(self, keys: Iterable[bytes]) -> None:
        order = self._order
        move = order.move_to_end
        for key in keys:
            if key in order:
                move(key)

    def remove(self, key: bytes) -> None:
        self._order.pop(key, None)

    def victim(self, pinned: Pinned | None = None) -> bytes | None:
        return _first_free(self._order, pinned)

    def __len__(self) -> int:
        return len(self._order)


class ARC:
    """Adaptive Replacement Cache (Megiddo & Modha): balances recency against frequency.

    Keys seen once live in T1, keys seen again in T2; ghosts of evicted keys (B1, B2) steer the
    target size ``p`` of T1. ARC counts blocks, not bytes: ``capacity`` (blocks) bounds the ghost
    lists and ``p``; by default it follows the most keys held at once.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self._fixed = capacity
        self._c = capacity or 1
        self.p = 0.0
        self._t1: OrderedDict[bytes, None] = OrderedDict()
        self._t2: OrderedDict[bytes, None] = OrderedDict()
        self._b1: OrderedDict[bytes, None] = OrderedDict()
        self._b2: OrderedDict[bytes, None] = OrderedDict()
        self._named: bytes | None = None

    def insert(self, key: bytes, size: int, value: float = 0.0) -> None:
        if key in self._t1 or key in self._t2:
            self.touch(key)
            return
        if key in self._b1:  # recency was evicted too early: grow T1's share
            self.p = min(float(self._c), self.p + max(len(self._b2) / len(self._b1), 1.0))
            del self._b1[key]
            self._t2[key] = None
        elif key in self._b2:  # frequency was evicted too early: shrink T1's share
            self.p = max(0.0, self.p - max(len(self._b1) / len(self._b2), 1.0))
            del self._b2[key]
            self._t2[key] = None
        else:
            self._t1[key] = None
        held = len(self._t1) + len(self._t2)
        if self._fixed is None and held > self._c:
            self._c = held

    def touch(self, key: bytes) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def touch_many(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self.touch(key)

    def remove(self, key: bytes) -> None:
        evicted = key == self._named
        self._named = None
        if key in self._t1:
            del self._t1[key]
            ghosts = self._b1
        elif key in self._t2:
            del self._t2[key]
            ghosts = self._b2
        else:
            return
        if evicted:  # remember it: a quick return proves the eviction wrong
            ghosts[key] = None
            self._trim_ghosts()

    def victim(self, pinned: Pinned | None = None) -> bytes | None:
        first, second = (
            (self._t1, self._t2)
            if self._t1 and (len(self._t1) > self.p or not self._t2)
            else (self._t2, self._t1)
        )
        self._named = _first_free(first, pinned) or _first_free(second, pinned)
        return self._named

    def _trim_ghosts(self) -> None:
        while len(self._b1) + len(self._b2) > self._c:
            ghosts = self._b1 if len(self._b1) > self.p or not self._b2 else self._b2
            ghosts.popitem(last=False)

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)


class CostAware:
    """Evicts the block that saves the fewest seconds of prefill per byte held (GreedyDual-Size).

    A block's priority is ``clock + value / size``; each eviction raises ``clock`` to the evicted
    priority, so blocks that are not read again age out even when valuable, and a hit refreshes
    a block's priority. Ties go to the least recently used. With every value 0 it is LRU.
    """

    def __init__(self) -> None:
        self.clock = 0.0
        self._entries: dict[bytes, tuple[float, int, float, int]] = {}  # priority, seq, value, size
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = itertools.count()
        self._named: tuple[bytes, float] | None = None

    def _push(self, key: bytes, value: float, size: int) -> None:
        priority = self.clock + value / max(size, 1)
        seq = next(self._seq)
        self._entries[key] = (priority, seq, value, size)
        heapq.heappush(self._heap, (priority, seq, key))
        if len(self._heap) > 2 * len(self._entries) + 64:
            self._heap = [(p, s, k) for k, (p, s, _, _) in self._entries.items()]
            heapq.heapify(self._heap)

    def insert(self, key: bytes, size: int, value: float = 0.0) -> None:
        if value < 0:
            raise ValueError(f"a block's value (seconds saved) cannot be negative: {value}")
        self._push(key, value, size)

    def touch(self, key: bytes) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            self._push(key, entry[2], entry[3])

    def touch_many(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self.touch(key)

    def remove(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and self._named is not None and self._named[0] == key:
            self.clock = max(self.clock, self._named[1])
        self._named = None

    def victim(self, pinned: Pinned | None = None) -> bytes | None:
        heap, entries = self._heap, self._entries
        held: list[tuple[float, int, bytes]] = []
        found: bytes | None = None
        while heap:
            item = heap[0]
            entry = entries.get(item[2])
            if entry is None or entry[1] != item[1]:
                heapq.heappop(heap)  # stale: removed or refreshed since
            elif pinned is not None and pinned(item[2]):
                held.append(heapq.heappop(heap))
            else:
                found = item[2]
                self._named = (found, item[0])
                break
        for item in held:
            heapq.heappush(heap, item)
        if found is None:
            self._named = None
        return found

    def priority(self, key: bytes) -> float | None:
        """Current priority of ``key`` (None when not held)."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def __len__(self) -> int:
        return len(self._entries)


def _first_free(keys: Iterable[bytes], pinned: Pinned | None) -> bytes | None:
    if pinned is None:
        return next(iter(keys), None)
    return next((k for k in keys if not pinned(k)), None)


POLICIES: dict[str, type] = {"lru": LRU, "arc": ARC, "cost": CostAware, "cost-aware": CostAware}


def make_policy(name: str, **kwargs) -> EvictionPolicy:
    """An eviction policy by name (``lru``, ``arc``, ``cost``)."""
    from kvtier.errors import ConfigError

    try:
        return POLICIES[name.lower()](**kwargs)
    except KeyError:
        raise ConfigError(
            f"unknown eviction policy {name!r}; choose {', '.join(POLICIES)}"
        ) from None
