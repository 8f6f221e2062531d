"""The tiers behind their circuit breakers: how the cache's parts call a tier and survive it.

A tier that raises is counted, logged once per outage and skipped for its back-off
(``breaker``); a bad block is a counted miss whose deletion is queued; and every change a
lookup could see (a write, a delete, an eviction, a tier leaving or coming back) advances the
epoch that callers use to tell whether a remembered lookup still holds.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence

from kvtier.cache.breaker import Breakers
from kvtier.cache.metrics import CacheMetrics
from kvtier.codec import BlockError, BlockHeader, BufferTooSmallError
from kvtier.tiers.base import Tier

log = logging.getLogger("kvtier.cache")


class TierDown:
    """Stands in for the result of a read the tier could not serve (it raised, or was
    skipped because its breaker is open)."""


DOWN = TierDown()  # the tier raised
SKIPPED = TierDown()  # the tier's breaker was open: not asked


class TierGuard:
    """Calls into ``tiers`` (fast→slow) through one breaker each, with their counters.

    ``discard(t, key)`` is called for a bad block tier ``t`` returned (the cache queues its
    deletion on that tier's writer).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        names: Sequence[str],
        metrics: CacheMetrics,
        breakers: Breakers,
        discard: Callable[[int, bytes], None],
    ):
        self.tiers = tuple(tiers)
        self.names = tuple(names)
        self.metrics = metrics
        self._breakers = breakers
        self._discard = discard
        self._changes = itertools.count(1)
        self._epoch = 0
        self.largest_block = 0  # the largest block seen, to size copy buffers

    # --- state -----------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """Grows whenever what a lookup answers may have changed through this cache."""
        return self._epoch

    def changed(self) -> None:
        """Note a change a lookup could see."""
        self._epoch = next(self._changes)

    def saw_block(self, nbytes: int) -> None:
        """Note a block of ``nbytes`` passing through (sizes the buffers of later copies)."""
        if nbytes > self.largest_block:
            self.largest_block = nbytes

    def up(self, t: int) -> bool:
        """False while tier ``t`` is being skipped after a failure."""
        return self._breakers.up(t)

    def failed(self, t: int, op: str, exc: BaseException) -> None:
        """Open tier ``t``'s breaker: skip it for the back-off, doubled per failure in a row."""
        self.metrics.count(t, tier_errors=1)
        opened = self._breakers.failed(t)
        self.changed()
        if opened.first:
            self.metrics.count(t, tier_outages=1)
            log.warning(
                "kvtier cache: tier %s failed on %s (%s: %s); treating it as a miss for %.1f s",
                self.names[t],
                op,
                type(exc).__name__,
                exc,
                opened.wait_s,
            )

    def succeeded(self, t: int) -> None:
        """Close tier ``t``'s breaker after an operation it answered."""
        if self._breakers.succeeded(t):
            self.changed()
            log.warning("kvtier cache: tier %s answers again", self.names[t])

    def down_gauge(self) -> list[tuple[str, float]]:
        """(tier name, 1.0 while skipped else 0.0) per tier."""
        return [(name, 0.0 if self.up(i) else 1.0) for i, name in enumerate(self.names)]

    # --- reads -----------------------------------------------------------------------------
    def read(self, t: int, keys: Sequence[bytes], outs: Sequence) -> list:
        """Tier ``t``'s ``get_many_into``: a header, None (a miss) or a BlockError per key, or
        DOWN/SKIPPED for every key when the tier raised or is being skipped."""
        if not self.up(t):
            return [SKIPPED] * len(keys)
        began = time.perf_counter()
        try:
            results = self.tiers[t].get_many_into(keys, outs)
        except BufferTooSmallError:
            raise  # the caller's buffers are too small: a bug to fix, not a miss
        except Exception as exc:
            self.failed(t, "get", exc)
            return [DOWN] * len(keys)
        self.succeeded(t)
        self.metrics.observe("read", t, time.perf_counter() - began, len(keys))
        return results

    def read_below(self, failed: int, key: bytes, out) -> tuple[int, BlockHeader | None, int, int]:
        """Try the tiers slower than ``failed`` for one chunk: (tier, header, corrupt, errors)."""
        corrupt = errors = 0
        for t in range(failed + 1, len(self.tiers)):
            if not self.up(t):
                continue
            try:
                header = self.tiers[t].get_into(key, out)
            except BufferTooSmallError:
                raise
            except Exception as exc:
                header = exc if isinstance(exc, BlockError) else DOWN
                if header is DOWN:
                    self.failed(t, "get", exc)
            if isinstance(header, BlockHeader):
                return t, header, corrupt, errors
            if header is not None:
                c, e = self.account(t, key, header)
                corrupt, errors = corrupt + c, errors + e
        return -1, None, corrupt, errors

    def account(self, t: int, key: bytes, result) -> tuple[int, int]:
        """Count a chunk tier ``t`` did not serve: (corrupt, errors); a bad block is discarded."""
        if isinstance(result, BlockError):
            log.warning(
                "kvtier cache: bad block in tier %s (%s); deleting it", self.names[t], result
            )
            self.metrics.count(t, corrupt_blocks=1)
            self._discard(t, key)
            return 1, 0
        if result is None:
            self.metrics.count(t, load_misses=1)
            return 0, 0
        return 0, 1  # the tier failed (already counted) or is being skipped


__all__ = ["DOWN", "SKIPPED", "TierDown", "TierGuard"]
