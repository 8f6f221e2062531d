"""What lookup, load and prefetch answer."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvtier.cache.leases import Lease


@dataclass(frozen=True)
class LookupResult:
    """The longest contiguous prefix of the asked keys that some tier holds, and where.

    ``tiers[i]`` is the index (fast→slow) of the fastest tier holding chunk ``i`` of the prefix.
    """

    requested: int
    tiers: list[int]
    names: tuple[str, ...]
    seconds: float = 0.0
    chunk_tokens: int = 0

    @property
    def hit_chunks(self) -> int:
        """Chunks in the prefix hit."""
        return len(self.tiers)

    @property
    def hit_tokens(self) -> int:
        """Tokens in the prefix hit (``hit_chunks × chunk_tokens``)."""
        return len(self.tiers) * self.chunk_tokens

    @property
    def tier_names(self) -> list[str]:
        """Name of the tier serving each hit chunk."""
        names = self.names
        return [names[t] for t in self.tiers]

    def runs(self, n: int | None = None) -> Iterator[tuple[int, int, int]]:
        """``(tier, start, end)`` of each run of chunks the same tier holds, over the first
        ``n`` chunks of the prefix (all of it by default): one batched read each."""
        start = 0
        for tier, run in itertools.groupby(self.tiers[:n]):
            end = start + sum(1 for _ in run)
            yield tier, start, end
            start = end

    def per_tier(self) -> dict[str, int]:
        """Hit chunks per tier name (tiers serving none are left out)."""
        counts = Counter(self.tiers)
        return {self.names[t]: counts[t] for t in sorted(counts)}


@dataclass(frozen=True)
class LoadResult:
    """Chunks read into the caller's buffers: the first ``loaded`` of them, in order.

    Why fewer than asked were loaded: ``located`` is the hit prefix the load's lookup found
    (chunks past it were misses), ``corrupt`` bad blocks, ``errors`` reads a tier failed or
    skipped, ``skipped`` of those because the tier's breaker was open after a failure.
    """

    loaded: int
    bytes: int
    per_tier: dict[str, int]
    seconds: float
    tiers: list[int] = field(default_factory=list)
    corrupt: int = 0
    errors: int = 0
    located: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class PrefetchResult:
    """A prefetch's outcome: ``ready`` leading chunks now sit in the fastest tier.

    ``promoted`` of them were copied up by this prefetch; ``lease`` pins them for
    ``CacheConfig.prefetch_pin_s`` (None when not pinned); release it once loaded.
    """

    ready: int
    promoted: int
    lease: Lease | None = None
