"""Per-tier circuit breakers: a tier that fails is skipped for a while, then tried again.

A failure opens the tier's breaker for ``backoff_s`` doubled per failure in a row (up to
``backoff_max_s``); while open, the cache treats the tier as a miss and writes nothing to it;
the first operation it answers after that closes it. The cache's lookups, loads, writer threads
and prefetcher all report here, so the state is changed under a lock of its own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Opened:
    """What a failure did: the seconds the tier is skipped, and whether it was up before."""

    wait_s: float
    first: bool  # the tier was answering until this failure (an outage begins)


class Breakers:
    """The breakers of ``n`` tiers."""

    def __init__(self, n: int, backoff_s: float, backoff_max_s: float):
        self._lock = threading.Lock()
        self._down_until = [0.0] * n
        self._failures = [0] * n  # failures in a row, per tier
        self._backoff_s = backoff_s
        self._backoff_max_s = max(backoff_max_s, backoff_s)

    def up(self, t: int) -> bool:
        """False while tier ``t`` is skipped after a failure."""
        until = self._down_until[t]  # one read of a float: no lock needed
        return until == 0.0 or until <= time.monotonic()

    def failed(self, t: int) -> Opened:
        """Tier ``t`` failed: open its breaker for the back-off, doubled per failure in a row."""
        with self._lock:
            was_up = self.up(t)
            self._failures[t] += 1
            wait = min(self._backoff_s * 2 ** min(self._failures[t] - 1, 30), self._backoff_max_s)
            self._down_until[t] = time.monotonic() + wait
            return Opened(wait, was_up and self._failures[t] == 1)

    def succeeded(self, t: int) -> bool:
        """Tier ``t`` answered: close its breaker. True if it was open (it answers again)."""
        if not self._failures[t]:  # the common case, read without the lock
            return False
        with self._lock:
            if not self._failures[t]:
                return False
            self._failures[t] = 0
            self._down_until[t] = 0.0
            return True


__all__ = ["Breakers", "Opened"]
