"""The host-DRAM tier (``memory://``): a slot arena and a lock-free one-block read path."""

from kvtier.tiers.memory.tier import MemoryTier

__all__ = ["MemoryTier"]
