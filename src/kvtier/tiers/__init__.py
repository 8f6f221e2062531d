"""Storage tiers behind one small contract, opened by URL."""

from kvtier.tiers.base import Tier, TierCapabilities, TierURL, TierUsage
from kvtier.tiers.registry import REGISTRY, open_tier, tier_class

__all__ = [
    "REGISTRY",
    "Tier",
    "TierCapabilities",
    "TierURL",
    "TierUsage",
    "open_tier",
    "tier_class",
]
