"""The reuse hints an engine records before a request, read by the tiers' hinted admission.

A bounded, thread-safe store of :class:`~kvtier.policy.reuse.ChunkValue` by key: the engine
thread writes it, the cache's write-back workers read it through
:class:`~kvtier.policy.reuse.HintedAdmission` (which holds no lock of its own).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from kvtier.errors import ConfigError
from kvtier.policy.reuse import ChunkValue


class ReuseHints:
    """Expected value of chunks about to be stored, by key (thread-safe, bounded)."""

    def __init__(self, window: int = 65536):
        if window < 1:
            raise ConfigError("ReuseHints needs window >= 1")
        self.window = window
        self._values: OrderedDict[bytes, ChunkValue] = OrderedDict()
        self._last: tuple[ChunkValue, ...] = ()
        self._lock = threading.Lock()

    def set(self, keys: Sequence[bytes], values: Sequence[ChunkValue]) -> None:
        """Record the value of each key (the latest hint for a key wins)."""
        with self._lock:
            self._last = tuple(values)
            for key, value in zip(keys, values, strict=True):
                self._values.pop(key, None)
                self._values[key] = value
            while len(self._values) > self.window:
                self._values.popitem(last=False)

    def value_at(self, index: int) -> float:
        """Expected seconds saved by chunk ``index`` of the prompt last :meth:`set` (0 if none).

        The engine's ``chunk_value`` hook: stored blocks carry it for cost-aware eviction.
        """
        with self._lock:
            return self._last[index].value_s if 0 <= index < len(self._last) else 0.0

    def get(self, key: bytes) -> ChunkValue | None:
        """The hint for ``key``, or None when none was given."""
        with self._lock:
            return self._values.get(key)
