"""kvtier's counters travel as vLLM stats and land in Prometheus series."""

from __future__ import annotations

import pytest

from kvtier.engines.vllm.stats import ConnectorCounters, KVTierStats


def test_counters_are_taken_once_and_aggregate_by_sum():
    a, b = ConnectorCounters(), ConnectorCounters()
    a.add("loaded_tokens", 1024)
    a.add("tier_loaded_bytes", 100, tier="host")
    a.observe("kv_wait_seconds", 0.5)
    b.add("loaded_tokens", 256)
    b.add("tier_loaded_bytes", 50, tier="host")
    sa, sb = a.take(), b.take()
    assert a.take() is None  # taken: nothing left
    total = sa.aggregate(sb)
    assert total.data["counts"] == {"loaded_tokens": 1280, "tier_loaded_bytes@host": 150}
    assert total.reduce()["tier_loaded_bytes_host"] == 150
    assert total.reduce()["kv_wait_seconds_mean"] == 0.5
    assert not total.is_empty() and KVTierStats().is_empty()


def test_a_caches_tier_errors_and_outages_are_carried_over_as_they_grow():
    from kvtier.cache.metrics import CacheMetrics

    metrics = CacheMetrics(("host", "redis"), 256, (0.1,))
    counters = ConnectorCounters(metrics)
    assert counters.take() is None  # nothing failed yet
    metrics.count(1, tier_errors=3, tier_outages=1)
    taken = counters.take()
    assert taken.data["counts"] == {"tier_errors@redis": 3, "tier_outages@redis": 1}
    assert counters.take() is None  # carried once
    metrics.count(1, tier_errors=2)
    assert counters.take().data["counts"] == {"tier_errors@redis": 2}


def test_measurements_for_the_cost_model_survive_aggregation():
    """They travel in the workers' reports (vLLM's worker-metadata channel), not in stats."""
    from kvtier.engines.vllm.metadata import KVTierWorkerMeta

    a = KVTierWorkerMeta(prefills=[(512, 0, 0.5)], synced=[("r1", 0.01)])
    b = KVTierWorkerMeta(loads=[("host", 10, 0.1, 1)], changed=True)
    both = a.aggregate(b)
    assert both.prefills == [(512, 0, 0.5)] and both.loads == [("host", 10, 0.1, 1)]
    assert both.synced == [("r1", 0.01)] and both.changed
    assert not KVTierWorkerMeta() and both


def test_prometheus_series_carry_engine_and_tier_labels():
    pytest.importorskip("vllm")
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from kvtier.engines.vllm.stats import KVTierPromMetrics

    registry = CollectorRegistry()

    def bound(cls):
        class Bound(cls):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, registry=registry, **kwargs)

        return Bound

    class Config:
        kv_transfer_config = None

    metric_types = {Gauge: bound(Gauge), Counter: bound(Counter), Histogram: bound(Histogram)}
    prom = KVTierPromMetrics(Config(), metric_types, ["engine"], {0: ["0"]})
    prom.observe(
        {
            "counts": {"loaded_tokens": 1024, "tier_hit_tokens@host": 1024},
            "observed": {"kv_wait_seconds": [0.02, 0.04]},
        }
    )
    text = generate_latest(registry).decode()
    assert 'kvtier_loaded_tokens_total{engine="0"} 1024.0' in text
    assert 'kvtier_tier_hit_tokens_total{engine="0",tier="host"} 1024.0' in text
    assert 'kvtier_kv_wait_seconds_count{engine="0"} 2.0' in text
