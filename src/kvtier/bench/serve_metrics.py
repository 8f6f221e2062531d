"""A server's ``/metrics`` around one client run: vLLM's prefix-cache counters and kvtier's own
series, scraped before and after, as the difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kvtier.harness.scrape import CACHE_PREFIXES, parse_metrics, scrape_metrics
from kvtier.harness.scrape import metrics_delta as delta

#: Series kept from a scrape: vLLM's token and cache counters, and every kvtier one.
PREFIXES = CACHE_PREFIXES


def scrape(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The server's cache and token series (:data:`PREFIXES`) as plain series ({} when
    unreadable)."""
    return scrape_metrics(base_url, timeout_s, PREFIXES)


def _total(d: Mapping[str, float], name: str) -> float:
    """The sum of every labelled series of ``name``."""
    return sum(v for k, v in d.items() if k == name or k.startswith(name + "{"))


#: The ``/metrics`` series behind each of :class:`CacheCounters`' totals.
SERIES = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "local_queries": "vllm:prefix_cache_queries_total",
    "local_hits": "vllm:prefix_cache_hits_total",
    "external_queries": "vllm:external_prefix_cache_queries_total",
    "external_hits": "vllm:external_prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "kvtier_hit_tokens": "kvtier_hit_tokens_total",
    "kvtier_loaded_tokens": "kvtier_loaded_tokens_total",
    "kvtier_load_errors": "kvtier_load_errors_total",
    "kvtier_stored_chunks": "kvtier_stored_chunks_total",
    "kvtier_unadmitted_chunks": "kvtier_unadmitted_chunks_total",
    "kvtier_forward_blocked_s": "kvtier_forward_blocked_seconds_total",
}


@dataclass(frozen=True)
class CacheCounters:
    """What one run did to the caches, from the ``/metrics`` difference.

    ``local_*``: vLLM's own prefix cache (tokens); ``external_*``: a KV connector's, as vLLM
    counts them; ``kvtier_*``: kvtier's own series (``tier_hit_tokens`` per tier).
    """

    prompt_tokens: float = 0.0
    local_queries: float = 0.0
    local_hits: float = 0.0
    external_queries: float = 0.0
    external_hits: float = 0.0
    preemptions: float = 0.0
    kvtier_hit_tokens: float = 0.0
    kvtier_loaded_tokens: float = 0.0
    kvtier_load_errors: float = 0.0
    kvtier_stored_chunks: float = 0.0
    kvtier_unadmitted_chunks: float = 0.0
    kvtier_forward_blocked_s: float = 0.0
    tier_hit_tokens: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_delta(cls, d: Mapping[str, float]) -> CacheCounters:
        """Read a :func:`delta` of two scrapes."""
        tiers: dict[str, float] = {}
        prefix = "kvtier_tier_hit_tokens_total{"
        for key, value in d.items():
            if key.startswith(prefix):
                labels = dict(p.split("=", 1) for p in key[len(prefix) : -1].split(",") if p)
                tier = labels.get("tier", "?")
                tiers[tier] = tiers.get(tier, 0.0) + value
        totals = {name: _total(d, series) for name, series in SERIES.items()}
        return cls(**totals, tier_hit_tokens=dict(sorted(tiers.items())))

    @property
    def local_hit_rate(self) -> float | None:
        """Share of the queried prompt tokens vLLM's own prefix cache held."""
        return self.local_hits / self.local_queries if self.local_queries else None

    @property
    def external_hit_rate(self) -> float | None:
        """Share of the tokens asked of the connector that it held."""
        return self.external_hits / self.external_queries if self.external_queries else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with both hit rates."""
        out = asdict(self)
        out["local_hit_rate"] = self.local_hit_rate
        out["external_hit_rate"] = self.external_hit_rate
        return out


__all__ = ["PREFIXES", "CacheCounters", "delta", "parse_metrics", "scrape"]
