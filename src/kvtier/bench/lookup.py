"""The lookup row: ``TieredCache.lookup`` of a long prefix whose chunks sit in the slowest tier."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.bench.results import LookupMeasurement
from kvtier.bench.stats import LatencyStats
from kvtier.codec.container import RAW_META
from kvtier.keys import ChunkKeyer, Namespace
from kvtier.tiers import Tier

LOOKUP_BLOCK = 4096  # lookup never reads payloads: small blocks make the setup quick


def measure_lookup(
    tiers: Sequence[Tier],
    namespace: Namespace,
    chunks: int = 512,
    chunk_tokens: int = 256,
    repeats: int = 200,
    warmup: int = 20,
) -> LookupMeasurement:
    """Store ``chunks`` chained chunk keys in the last tier, then time ``lookup`` over them.

    Every faster tier is asked first and misses, so this is the longest walk a hit can take.
    The blocks are deleted afterwards.
    """
    from kvtier.cache import CacheConfig, TieredCache, time_lookup

    keyer = ChunkKeyer(namespace, chunk_tokens)
    tokens = np.random.default_rng(0).integers(0, 32000, chunks * chunk_tokens)
    keys = keyer.keys(tokens)
    payload = np.zeros(LOOKUP_BLOCK, np.uint8)
    slowest = tiers[-1]
    stored = slowest.put_many([(k, payload, RAW_META) for k in keys])
    cache = TieredCache(tiers, CacheConfig(chunk_tokens=chunk_tokens))
    try:
        timing = time_lookup(cache, keys, repeats, warmup)
    finally:
        cache.close()
        slowest.delete_many([k for k, ok in zip(keys, stored, strict=True) if ok])
    return LookupMeasurement(
        chunks=chunks,
        tokens=chunks * chunk_tokens,
        tiers=tuple(t.name for t in tiers),
        hit_chunks=timing.hit_chunks,
        latency=LatencyStats.from_samples(timing.samples_s),
    )
