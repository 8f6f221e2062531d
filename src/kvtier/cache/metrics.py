"""Per-tier cache metrics: plain counters and histograms, exported as a dict and for Prometheus.

Counting is a few integer additions under one lock per operation (not per chunk). Prometheus
reads the same numbers at scrape time through a collector registered in a per-cache
``CollectorRegistry``: no global state, two caches never share a metric.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

PREFIX = "kvtier_cache"


@dataclass
class TierCounters:
    """Running totals for one tier."""

    hits: int = 0  # chunks of a returned prefix that this tier served
    misses: int = 0  # chunks this tier was asked for in a lookup and did not hold
    hit_tokens: int = 0
    reads: int = 0  # chunks read into buffers (loads, prefetches)
    bytes_read: int = 0
    writes: int = 0  # chunks written (stores, promotions, write-backs)
    bytes_written: int = 0
    promotions: int = 0  # chunks written here because a slower tier served them
    write_backs: int = 0  # chunks written here because the faster tier evicted them
    rejected_writes: int = 0  # put() said no (no room, pinned victims, tier admission)
    not_admitted: int = 0  # turned away by the cache's admission policy for this tier
    evictions: int = 0
    dropped_writes: int = 0  # queue full or tier down: the write never happened
    corrupt_blocks: int = 0
    tier_errors: int = 0
    tier_outages: int = 0  # times the tier's breaker opened (it failed after answering)
    load_misses: int = 0  # a located block had gone by the time it was read


COUNTER_DOCS = {
    "hits": "chunks of a returned prefix served by this tier",
    "misses": "chunks a lookup asked this tier for that it did not hold",
    "hit_tokens": "tokens in chunks served by this tier (hits x chunk_tokens)",
    "reads": "chunks read from this tier into buffers",
    "bytes_read": "raw bytes read from this tier",
    "writes": "chunks written to this tier",
    "bytes_written": "raw bytes written to this tier",
    "promotions": "chunks copied here after a slower tier served them",
    "write_backs": "chunks written here when the faster tier evicted them",
    "rejected_writes": "writes the tier refused (no room, admission)",
    "not_admitted": "writes the cache's admission policy turned away",
    "evictions": "blocks the tier evicted to make room",
    "dropped_writes": "writes dropped because the queue was full or the tier was down",
    "corrupt_blocks": "blocks that failed their checks (counted as misses and deleted)",
    "tier_errors": "tier operations that raised (I/O, connection, timeout)",
    "tier_outages": "times the tier was taken out of use after failing (circuit breaker)",
    "load_misses": "located blocks that were gone when read",
}


class Histogram:
    """Fixed-bucket histogram of seconds (not thread-safe; CacheMetrics locks around it)."""

    def __init__(self, buckets: Sequence[float]):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += n
        self.count += n
        self.sum += seconds * n

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, cumulative count) pairs, ending with ``+Inf``."""
        out, total = [], 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out

    def as_dict(self) -> dict:
        return {"count": self.count, "sum": self.sum, "buckets": dict(self.cumulative())}


class CacheMetrics:
    """Counters and latency histograms of one TieredCache, per tier and for the whole cache."""

    def __init__(
        self, tier_names: Sequence[str], chunk_tokens: int, buckets: Sequence[float]
    ) -> None:
        self.tier_names = tuple(tier_names)
        self.chunk_tokens = chunk_tokens
        self._lock = threading.Lock()
        self.tiers = [TierCounters() for _ in tier_names]
        self.read_seconds = [Histogram(buckets) for _ in tier_names]
        self.write_seconds = [Histogram(buckets) for _ in tier_names]
        self.contains_seconds = [Histogram(buckets) for _ in tier_names]
        self.lookup_seconds = Histogram(buckets)
        self.load_seconds = Histogram(buckets)
        self.lookups = 0
        self.lookup_chunks = 0
        self.prefix_chunks = 0
        self.loads = 0
        self.loaded_chunks = 0
        self.stores = 0
        self.stored_chunks = 0
        self._gauges: list[tuple[str, str, Callable[[], Iterable[tuple[str, float]]]]] = []
        self._registry: CollectorRegistry | None = None

    # --- recording -----------------------------------------------------------------------
    def count(self, tier: int, **amounts: int) -> None:
        """Add to one tier's counters, e.g. ``count(0, reads=4, bytes_read=4096)``."""
        with self._lock:
            counters = self.tiers[tier]
            for name, amount in amounts.items():
                setattr(counters, name, getattr(counters, name) + amount)

    def record_lookup(
        self,
        requested: int,
        prefix: int,
        hits: Sequence[int],
        misses: Sequence[int],
        seconds: float,
    ) -> None:
        """One lookup: chunks asked, prefix found, per-tier hits and misses, duration."""
        with self._lock:
            self.lookups += 1
            self.lookup_chunks += requested
            self.prefix_chunks += prefix
            self.lookup_seconds.observe(seconds)
            for counters, hit, miss in zip(self.tiers, hits, misses, strict=True):
                counters.hits += hit
                counters.hit_tokens += hit * self.chunk_tokens
                counters.misses += miss

    def record_load(self, chunks: int, seconds: float) -> None:
        with self._lock:
            self.loads += 1
            self.loaded_chunks += chunks
            self.load_seconds.observe(seconds)

    def record_store(self, chunks: int) -> None:
        with self._lock:
            self.stores += 1
            self.stored_chunks += chunks

    def observe(self, kind: str, tier: int, seconds: float, n: int = 1) -> None:
        """Latency of one tier operation; ``kind`` is ``read``, ``write`` or ``contains``.

        ``seconds`` is per chunk: a batch of ``n`` chunks that took ``t`` observes ``t / n``
        ``n`` times.
        """
        hist = getattr(self, f"{kind}_seconds")[tier]
        with self._lock:
            hist.observe(seconds / max(n, 1), n)

    def add_gauge(
        self, name: str, doc: str, read: Callable[[], Iterable[tuple[str, float]]]
    ) -> None:
        """A per-tier gauge read at export time: ``read()`` yields (tier name, value) pairs."""
        self._gauges.append((name, doc, read))

    # --- export --------------------------------------------------------------------------
    def as_dict(self) -> dict:
        """Every number as plain Python data (JSON-ready)."""
        with self._lock:
            tiers = {}
            for i, name in enumerate(self.tier_names):
                entry: dict = asdict(self.tiers[i])
                entry["read_seconds"] = self.read_seconds[i].as_dict()
                entry["write_seconds"] = self.write_seconds[i].as_dict()
                entry["contains_seconds"] = self.contains_seconds[i].as_dict()
                tiers[name] = entry
            out = {
                "chunk_tokens": self.chunk_tokens,
                "lookups": self.lookups,
                "lookup_chunks": self.lookup_chunks,
                "prefix_chunks": self.prefix_chunks,
                "hit_tokens": self.prefix_chunks * self.chunk_tokens,
                "loads": self.loads,
                "loaded_chunks": self.loaded_chunks,
                "stores": self.stores,
                "stored_chunks": self.stored_chunks,
                "lookup_seconds": self.lookup_seconds.as_dict(),
                "load_seconds": self.load_seconds.as_dict(),
                "tiers": tiers,
            }
        for name, _, read in self._gauges:
            for tier, value in _safe(read):
                out["tiers"].setdefault(tier, {})[name] = value
        return out

    @property
    def registry(self) -> CollectorRegistry:
        """This cache's own Prometheus registry (created on first use)."""
        if self._registry is None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Collector(self))
            self._registry = registry
        return self._registry

    def prometheus_text(self) -> str:
        """The Prometheus text exposition of this cache's metrics."""
        return generate_latest(self.registry).decode()


def _safe(read: Callable[[], Iterable[tuple[str, float]]]) -> list[tuple[str, float]]:
    try:
        return list(read())
    except Exception:  # a gauge must never break an export (e.g. a tier that is down)
        return []


class _Collector:
    """Yields the metric families of one CacheMetrics at scrape time."""

    def __init__(self, metrics: CacheMetrics):
        self.metrics = metrics

    def collect(self):
        m = self.metrics
        data = m.as_dict()
        for field, doc in COUNTER_DOCS.items():
            family = CounterMetricFamily(f"{PREFIX}_{field}", doc, labels=["tier"])
            for tier in m.tier_names:
                family.add_metric([tier], data["tiers"][tier][field])
            yield family
        for kind in ("read", "write", "contains"):
            family = HistogramMetricFamily(
                f"{PREFIX}_{kind}_seconds",
                f"seconds per chunk of tier {kind} operations",
                labels=["tier"],
            )
            for tier in m.tier_names:
                hist = data["tiers"][tier][f"{kind}_seconds"]
                family.add_metric([tier], list(hist["buckets"].items()), hist["sum"])
            yield family
        for field in (
            "lookups",
            "lookup_chunks",
            "prefix_chunks",
            "loads",
            "loaded_chunks",
            "stores",
            "stored_chunks",
        ):
            yield CounterMetricFamily(f"{PREFIX}_{field}", f"cache {field}", value=data[field])
        for kind in ("lookup", "load"):
            hist = data[f"{kind}_seconds"]
            family = HistogramMetricFamily(f"{PREFIX}_{kind}_seconds", f"seconds per {kind}")
            family.add_metric([], list(hist["buckets"].items()), hist["sum"])
            yield family
        for name, doc, read in m._gauges:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["tier"])
            for tier, value in _safe(read):
                family.add_metric([tier], value)
            yield family
