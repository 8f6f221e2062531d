"""Eviction policies: which held block goes first when a tier needs room.

A policy tracks keys only; the tier owns the bytes. Contract: ``insert`` a new key, ``touch`` on
every hit, ``remove`` when the tier drops a key for any reason, ``victim`` names the next key to
drop without removing it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class EvictionPolicy(Protocol):
    """Orders the keys a tier holds by who leaves first."""

    def insert(self, key: bytes, size: int, value: float = 0.0) -> None:
        """A new block arrived (``value``: seconds of prefill it saves, for cost-aware policies)."""
        ...

    def touch(self, key: bytes) -> None:
        """The block was read."""
        ...

    def remove(self, key: bytes) -> None:
        """The block left the tier (evicted or deleted)."""
        ...

    def victim(self) -> bytes | None:
        """The key to evict next, or None when empty."""
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

    def remove(self, key: bytes) -> None:
        self._order.pop(key, None)

    def victim(self) -> bytes | None:
        return next(iter(self._order), None)

    def __len__(self) -> int:
        return len(self._order)


POLICIES: dict[str, type] = {"lru": LRU}


def make_policy(name: str, **kwargs) -> EvictionPolicy:
    """An eviction policy by name (``lru``, ``arc``, ``cost``)."""
    from kvtier.errors import ConfigError

    try:
        return POLICIES[name.lower()](**kwargs)
    except KeyError:
        raise ConfigError(
            f"unknown eviction policy {name!r}; choose {', '.join(POLICIES)}"
        ) from None
