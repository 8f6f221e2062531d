"""Timing of the lookup hot path, for benchmarks (tests check correctness, not speed)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.cache.tiered import TieredCache


@dataclass(frozen=True)
class LookupTiming:
    """Wall-clock seconds per ``TieredCache.lookup`` of ``chunks`` keys over ``repeats`` calls."""

    chunks: int
    repeats: int
    hit_chunks: int
    median_s: float
    p99_s: float
    min_s: float
    samples_s: tuple[float, ...] = ()  # every call's seconds, in call order


def time_lookup(
    cache: TieredCache, keys: Sequence[bytes], repeats: int = 200, warmup: int = 20
) -> LookupTiming:
    """Call ``cache.lookup(keys)`` ``repeats`` times (after ``warmup``) and summarise the times."""
    keys = list(keys)
    for _ in range(warmup):
        cache.lookup(keys)
    times = []
    hit = 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = cache.lookup(keys)
        times.append(time.perf_counter() - start)
        hit = result.hit_chunks
    ranked = sorted(times)
    p99 = ranked[min(len(ranked) - 1, int(0.99 * len(ranked)))]
    return LookupTiming(
        len(keys), repeats, hit, statistics.median(ranked), p99, ranked[0], tuple(times)
    )
