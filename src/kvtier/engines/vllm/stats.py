"""kvtier's series on vLLM's ``/metrics``: per-tier hits, bytes and latency, tokens saved, waits.

Both halves count into a :class:`ConnectorCounters` between two of vLLM's stat collections; vLLM
sends the worker's to the scheduler, adds the scheduler's, and hands the sum to the API server,
where :class:`KVTierPromMetrics` adds it to Prometheus counters and histograms labelled by
engine (and tier, where there is one). Counters are named ``kvtier_<name>_total``; a tier's carry
the label ``tier``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.cache.metrics import CacheMetrics

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
    )
except ImportError:  # pragma: no cover - the counters are usable without vLLM

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: dict[str, Any] = field(default_factory=dict)

    class KVConnectorPromMetrics:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("vLLM is not installed")


#: Counters without a tier: name → help.
COUNTERS = {
    "lookups": "requests kvtier looked up",
    "remembered_lookups": "re-examinations of a waiting request answered without tier I/O",
    "deferred_lookups": "times vLLM was told 'not yet' while a lookup ran off its loop",
    "hit_tokens": "prompt tokens kvtier held beyond vLLM's own prefix cache",
    "loaded_tokens": "prompt tokens loaded from kvtier instead of prefilled",
    "prefill_seconds_saved": "predicted prefill seconds the loaded tokens saved",
    "predicted_load_seconds": "load seconds the cost model predicted for the loads made",
    "measured_load_seconds": "load seconds the loads took",
    "forward_blocked_seconds": (
        "seconds forwards waited for KV to load (before the forward, or in an attention layer)"
    ),
    "load_errors": "chunks that failed to load (vLLM recomputed their blocks)",
    "stored_chunks": "chunks handed to kvtier's tiers",
    "dropped_chunks": "chunks a full write queue dropped (counted by each rank that dropped one)",
    "unadmitted_chunks": "new chunks not stored: no earlier prompt held them (admit)",
    "unstorable_chunks": "new chunks not stored: vLLM had dropped a block of them (sliding window)",
    "store_seconds": "seconds the forward path spent copying new chunks out",
    "preloaded_chunks": "chunks moved up into the first tier while their request was queued",
    "preload_holds": "times a queued request was held back while its KV was moving up",
    "producer_waits": (
        "times a consumer held a request back until the chunks its producer stored were visible"
    ),
    "unkeyable_requests": (
        "requests neither loaded nor stored: an input that changes their KV could not be keyed"
    ),
}
#: Counters per tier: name → help.
TIER_COUNTERS = {
    "tier_hit_tokens": "tokens loaded from this tier",
    "tier_loaded_bytes": "bytes loaded from this tier",
    "tier_load_seconds": "seconds spent loading from this tier",
    "tier_errors": "operations on this tier that raised (connection, timeout, I/O), both halves",
    "tier_outages": "times a half took this tier out of use after it failed (circuit breaker)",
}
#: Per-tier counters of the cache's own metrics a half carries over at every collection.
CACHE_TIER_COUNTERS = ("tier_errors", "tier_outages")
#: Histograms: name → (help, buckets).
HISTOGRAMS = {
    "kv_wait_seconds": (
        "seconds from a request's scheduling to its KV being loaded",
        (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
    ),
}


class ConnectorCounters:
    """What one half counted since the last collection (thread-safe)."""

    def __init__(self, cache_metrics: CacheMetrics | None = None) -> None:
        """``cache_metrics``: the half's TieredCache metrics, whose tier errors and outages
        (:data:`CACHE_TIER_COUNTERS`) each collection carries over as they grow."""
        self._lock = threading.Lock()
        self._counts: defaultdict[str, float] = defaultdict(float)
        self._observed: defaultdict[str, list[float]] = defaultdict(list)
        self._cache_metrics = cache_metrics
        self._seen: dict[str, int] = {}

    def add(self, name: str, amount: float = 1.0, tier: str | None = None) -> None:
        """Add to counter ``name`` (of ``tier``, for per-tier counters)."""
        key = name if tier is None else f"{name}@{tier}"
        with self._lock:
            self._counts[key] += amount

    def observe(self, name: str, value: float) -> None:
        """One observation of histogram ``name``."""
        with self._lock:
            self._observed[name].append(float(value))

    def take(self) -> KVTierStats | None:
        """Everything counted since the last take, as vLLM's stats object (None if nothing)."""
        self._carry_cache_counts()
        with self._lock:
            if not self._counts and not self._observed:
                return None
            data = {"counts": dict(self._counts), "observed": dict(self._observed)}
            self._counts = defaultdict(float)
            self._observed = defaultdict(list)
        return KVTierStats(data=data)

    def _carry_cache_counts(self) -> None:
        metrics = self._cache_metrics
        if metrics is None:
            return
        for tier, counters in zip(metrics.tier_names, metrics.tiers, strict=True):
            for name in CACHE_TIER_COUNTERS:
                key = f"{name}@{tier}"
                now = getattr(counters, name)
                if now > self._seen.get(key, 0):
                    self.add(name, now - self._seen.get(key, 0), tier=tier)
                    self._seen[key] = now


@dataclass
class KVTierStats(KVConnectorStats):
    """kvtier's counters as vLLM carries them from the engine to the API server."""

    def __post_init__(self) -> None:
        self.data.setdefault("counts", {})
        self.data.setdefault("observed", {})

    def reset(self) -> None:
        self.data = {"counts": {}, "observed": {}}

    def aggregate(self, other: KVConnectorStats) -> KVTierStats:
        counts = dict(self.data["counts"])
        for key, value in other.data.get("counts", {}).items():
            counts[key] = counts.get(key, 0.0) + value
        observed = {k: list(v) for k, v in self.data["observed"].items()}
        for key, values in other.data.get("observed", {}).items():
            observed.setdefault(key, []).extend(values)
        return KVTierStats(data={"counts": counts, "observed": observed})

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {
            k.replace("@", "_"): round(v, 6) for k, v in sorted(self.data["counts"].items())
        }
        for key, values in self.data["observed"].items():
            if values:
                out[f"{key}_mean"] = round(sum(values) / len(values), 6)
        return out

    def is_empty(self) -> bool:
        return not self.data["counts"] and not self.data["observed"]


class KVTierPromMetrics(KVConnectorPromMetrics):
    """kvtier's Prometheus series in vLLM's API server, fed with :class:`KVTierStats` data."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            name: self._counter_cls(f"kvtier_{name}_total", doc, labelnames=labelnames)
            for name, doc in COUNTERS.items()
        }
        self._tier_counters = {
            name: self._counter_cls(f"kvtier_{name}_total", doc, labelnames=[*labelnames, "tier"])
            for name, doc in TIER_COUNTERS.items()
        }
        self._histograms = {
            name: self._histogram_cls(
                f"kvtier_{name}", doc, labelnames=labelnames, buckets=list(buckets)
            )
            for name, (doc, buckets) in HISTOGRAMS.items()
        }
        for engine, values in per_engine_labelvalues.items():  # series exist from the start
            for counter in self._counters.values():
                counter.labels(*values)
            for hist in self._histograms.values():
                hist.labels(*values)
            del engine

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        values = self.per_engine_labelvalues[engine_idx]
        for key, amount in transfer_stats_data.get("counts", {}).items():
            name, _, tier = key.partition("@")
            if tier and name in self._tier_counters:
                self._tier_counters[name].labels(*values, tier).inc(amount)
            elif name in self._counters:
                self._counters[name].labels(*values).inc(amount)
        for name, observations in transfer_stats_data.get("observed", {}).items():
            hist = self._histograms.get(name)
            if hist is not None:
                child = hist.labels(*values)
                for value in observations:
                    child.observe(value)


__all__ = ["ConnectorCounters", "KVTierPromMetrics", "KVTierStats"]
