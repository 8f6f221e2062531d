"""A vLLM server's ``/metrics`` as plain series: parsed, scraped and differenced.

One Prometheus sample becomes one ``"name{label=value,…}"`` key (labels sorted; the labels that
are the same on every series of one server dropped), so that two scrapes around a stretch of
work subtract key by key. ``kvtier run`` and ``kvtier bench serve`` both read their servers
through it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping

#: Label names dropped from scraped series (the same on every series of one server).
DROPPED_LABELS = ("engine", "model_name")
#: vLLM's token and cache counters and every kvtier counter: what a run did to the caches.
CACHE_PREFIXES = (
    "vllm:prefix_cache_",
    "vllm:external_prefix_cache_",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
    "kvtier_",
)
#: Series kept by default: the cache series, vLLM's per-request timings and kvtier's own.
METRIC_PREFIXES = (
    *CACHE_PREFIXES,
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "kvtier:",
)


def parse_metrics(text: str, prefixes: tuple[str, ...] = METRIC_PREFIXES) -> dict[str, float]:
    """Prometheus text → ``{"name{label=value,…}": value}`` for the series named by ``prefixes``
    (``*_created`` timestamps and the per-server labels dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if not name.startswith(prefixes) or name.endswith("_created"):
                continue
            labels = {k: v for k, v in sample.labels.items() if k not in DROPPED_LABELS}
            key = name
            if labels:
                key += "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
            out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def scrape_metrics(
    base_url: str, timeout_s: float = 10.0, prefixes: tuple[str, ...] = METRIC_PREFIXES
) -> dict[str, float]:
    """The server's ``/metrics`` as :func:`parse_metrics` gives it ({} when it cannot be read)."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=timeout_s) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError):
        return {}
    return parse_metrics(text, prefixes)


def metrics_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` per series (counters and histogram sums and buckets; a series new in
    ``after`` whole); series that did not change are left out."""
    out = {}
    for key, value in after.items():
        change = value - before.get(key, 0.0)
        if change:
            out[key] = round(change, 6)
    return out


__all__ = [
    "CACHE_PREFIXES",
    "DROPPED_LABELS",
    "METRIC_PREFIXES",
    "metrics_delta",
    "parse_metrics",
    "scrape_metrics",
]
