"""Pins with a deadline: a lease keeps keys from being evicted until released or expired.

Tiers ask :meth:`LeaseTable.is_pinned` from under their own locks, so it takes no lock: it reads
one dict entry (atomic in CPython) and compares it with the clock. Nothing stays pinned past its
deadline, even if the holder forgets to release or dies.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence

from kvtier.errors import ConfigError


class Lease(contextlib.AbstractContextManager):
    """Keys pinned until ``release()`` or until ``expires_at`` (``time.monotonic`` seconds)."""

    def __init__(
        self, table: LeaseTable, lease_id: int, keys: tuple[bytes, ...], expires_at: float
    ):
        self._table = table
        self.id = lease_id
        self.keys = keys
        self.expires_at = expires_at

    @property
    def active(self) -> bool:
        """Whether the lease still pins its keys."""
        return self._table.is_active(self)

    def release(self) -> None:
        """Unpin now (idempotent)."""
        self._table.release(self)

    def renew(self, ttl_s: float) -> None:
        """Pin for ``ttl_s`` more seconds from now (an expired lease cannot be renewed)."""
        self._table.renew(self, ttl_s)

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<Lease {self.id}: {len(self.keys)} keys, active={self.active}>"


class LeaseTable:
    """Active leases and, per key, the latest deadline among the leases that pin it."""

    def __init__(self, max_ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_ttl_s = max_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._leases: dict[int, Lease] = {}
        self._holders: dict[bytes, dict[int, float]] = {}
        self._deadline: dict[bytes, float] = {}  # read without the lock by is_pinned
        self._next_reap = 0.0

    def is_pinned(self, key: bytes) -> bool:
        """Whether some unexpired lease pins ``key``."""
        deadline = self._deadline.get(key)
        return deadline is not None and deadline > self._clock()

    def acquire(self, keys: Sequence[bytes], ttl_s: float) -> Lease:
        """Pin ``keys`` for ``ttl_s`` seconds (at most ``max_ttl_s``)."""
        if not ttl_s > 0:
            raise ConfigError(f"a lease needs a positive ttl, got {ttl_s}")
        now = self._clock()
        expires = now + min(ttl_s, self.max_ttl_s)
        with self._lock:
            self._reap(now)
            lease = Lease(self, next(self._ids), tuple(dict.fromkeys(keys)), expires)
            self._leases[lease.id] = lease
            for key in lease.keys:
                self._holders.setdefault(key, {})[lease.id] = expires
                if self._deadline.get(key, 0.0) < expires:
                    self._deadline[key] = expires
        return lease

    def release(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.pop(lease.id, None) is not None:
                self._drop(lease)

    def renew(self, lease: Lease, ttl_s: float) -> None:
        if not ttl_s > 0:
            raise ConfigError(f"a lease needs a positive ttl, got {ttl_s}")
        now = self._clock()
        with self._lock:
            if lease.id not in self._leases or lease.expires_at <= now:
                raise ConfigError("this lease has expired or was released; take a new one")
            lease.expires_at = now + min(ttl_s, self.max_ttl_s)
            for key in lease.keys:
                self._holders[key][lease.id] = lease.expires_at
                self._deadline[key] = max(self._holders[key].values())

    def is_active(self, lease: Lease) -> bool:
        return lease.id in self._leases and lease.expires_at > self._clock()

    def pinned_keys(self) -> int:
        """How many keys some unexpired lease pins now."""
        now = self._clock()
        with self._lock:
            self._reap(now, force=True)
            return len(self._deadline)

    def _drop(self, lease: Lease) -> None:
        for key in lease.keys:
            holders = self._holders.get(key)
            if holders is None:
                continue
            holders.pop(lease.id, None)
            if holders:
                self._deadline[key] = max(holders.values())
            else:
                del self._holders[key]
                self._deadline.pop(key, None)

    def _reap(self, now: float, force: bool = False) -> None:
        """Forget expired leases (at most once a second unless forced)."""
        if not force and now < self._next_reap:
            return
        self._next_reap = now + 1.0
        expired = [lease for lease in self._leases.values() if lease.expires_at <= now]
        for lease in expired:
            del self._leases[lease.id]
            self._drop(lease)
