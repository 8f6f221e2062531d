"""The live tiered KV cache: lookup, load, store, promote, write back, prefetch, pins, metrics."""

from kvtier.cache.config import CacheConfig, TierOptions
from kvtier.cache.leases import Lease
from kvtier.cache.metrics import CacheMetrics
from kvtier.cache.results import LoadResult, LookupResult, PrefetchResult
from kvtier.cache.staging import StagingPool
from kvtier.cache.tiered import TieredCache
from kvtier.cache.timing import LookupTiming, time_lookup

__all__ = [
    "CacheConfig",
    "CacheMetrics",
    "Lease",
    "LoadResult",
    "LookupResult",
    "LookupTiming",
    "PrefetchResult",
    "StagingPool",
    "TierOptions",
    "TieredCache",
    "time_lookup",
]
