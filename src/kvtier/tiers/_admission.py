"""Frequency admission: a block is admitted on its N-th put (one-hit wonders never reach a tier).

The rule behind the disk tiers' ``admit_after`` (a bounded, oldest-first forgotten count of
keys seen but not yet admitted), as a small object a tier owns. Not thread-safe: the owner
calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict

from kvtier.errors import ConfigError

SEEN_MAX = 1 << 16


class FrequencyAdmission:
    """Admit a key on its ``admit_after``-th put; ``admit_after=1`` admits everything."""

    def __init__(self, admit_after: int = 1, seen_max: int = SEEN_MAX):
        if admit_after < 1:
            raise ConfigError(f"admit_after must be at least 1, got {admit_after}")
        self.admit_after = admit_after
        self.seen_max = seen_max
        self._seen: OrderedDict[bytes, int] = OrderedDict()

    def admit(self, key: bytes, held: bool) -> bool:
        """Whether a put of ``key`` is admitted (``held``: the tier holds the key already)."""
        if self.admit_after <= 1 or held:
            return True
        seen = self._seen.pop(key, 0) + 1
        if seen >= self.admit_after:
            return True
        self._seen[key] = seen
        if len(self._seen) > self.seen_max:
            self._seen.popitem(last=False)
        return False


__all__ = ["FrequencyAdmission"]
