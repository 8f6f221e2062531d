"""Admission policies: whether a block offered to a tier (a store or a promotion) goes in.

Used unchanged by the live cache (per tier) and the simulator. Not thread-safe: the caller
serialises calls (the cache holds a lock around them).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from kvtier.errors import ConfigError


class AdmissionPolicy(Protocol):
    """Decides whether a block offered to a tier is written to it."""

    def admit(self, key: bytes, size: int, value: float = 0.0) -> bool:
        """Whether to write the block (``value``: seconds of prefill it saves, when known)."""
        ...


class AdmitAll:
    """Every block goes in."""

    def admit(self, key: bytes, size: int, value: float = 0.0) -> bool:
        return True


class FrequencyAdmission:
    """A block goes in on its ``min_hits``-th offer: one-hit wonders never displace others.

    Offers are counted per key in a bounded table of the ``window`` most recently offered keys,
    so the memory it needs is fixed and stale counts fade out.
    """

    def __init__(self, min_hits: int = 2, window: int = 65536):
        if min_hits < 1 or window < 1:
            raise ConfigError("FrequencyAdmission needs min_hits >= 1 and window >= 1")
        self.min_hits = min_hits
        self.window = window
        self._counts: OrderedDict[bytes, int] = OrderedDict()

    def admit(self, key: bytes, size: int, value: float = 0.0) -> bool:
        count = self._counts.pop(key, 0) + 1
        if count >= self.min_hits:
            return True  # admitted: forget it, the tier holds it now
        self._counts[key] = count
        if len(self._counts) > self.window:
            self._counts.popitem(last=False)
        return False


class MinValueAdmission:
    """A block goes in when it saves at least ``min_seconds_per_byte`` of prefill per byte.

    Blocks offered without a value (0) are admitted unless ``require_value``.
    """

    def __init__(self, min_seconds_per_byte: float, require_value: bool = False):
        if min_seconds_per_byte < 0:
            raise ConfigError("min_seconds_per_byte cannot be negative")
        self.min_seconds_per_byte = min_seconds_per_byte
        self.require_value = require_value

    def admit(self, key: bytes, size: int, value: float = 0.0) -> bool:
        if value <= 0:
            return not self.require_value
        return value / max(size, 1) >= self.min_seconds_per_byte


ADMISSIONS: dict[str, type] = {
    "all": AdmitAll,
    "frequency": FrequencyAdmission,
    "min-value": MinValueAdmission,
}


def make_admission(name: str, **kwargs) -> AdmissionPolicy:
    """An admission policy by name (``all``, ``frequency``, ``min-value``)."""
    try:
        cls = ADMISSIONS[name.lower()]
    except KeyError:
        raise ConfigError(
            f"unknown admission policy {name!r}; choose {', '.join(ADMISSIONS)}"
        ) from None
    return cls(**kwargs)
