"""The host-DRAM tier (``memory://``): a slot arena and a lock-free one-block read path.

``MemoryTier`` is imported on first use, so that reading the tier's URL options
(:mod:`kvtier.tiers.memory.options`) does not load the tier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.tiers.memory.tier import MemoryTier


def __getattr__(name: str) -> Any:
    if name == "MemoryTier":
        from kvtier.tiers.memory.tier import MemoryTier

        return MemoryTier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MemoryTier"]
