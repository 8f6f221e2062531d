"""Metrics: plain counters and histograms, a dict export and a per-cache Prometheus registry."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvtier.cache.metrics import CacheMetrics, Histogram


def _families(metrics: CacheMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.prometheus_text())}


def test_histogram_buckets_are_cumulative():
    hist = Histogram([0.001, 0.01, 0.1])
    for seconds in (0.0005, 0.005, 0.005, 0.05, 5.0):
        hist.observe(seconds)
    assert [count for _, count in hist.cumulative()] == [1, 3, 4, 5]
    assert hist.count == 5 and abs(hist.sum - 5.0605) < 1e-9
    hist.observe(0.01, n=3)  # a bound belongs to its own bucket
    assert hist.cumulative()[1] == ("0.01", 6)


def test_lookup_counts_hits_and_hit_tokens_per_tier():
    metrics = CacheMetrics(["memory", "disk"], chunk_tokens=256, buckets=[0.001, 0.01])
    metrics.record_lookup(8, 6, hits=[4, 2], misses=[4, 2], seconds=0.0002)
    data = metrics.as_dict()
    assert data["lookups"] == 1 and data["prefix_chunks"] == 6 and data["hit_tokens"] == 1536
    assert data["tiers"]["memory"]["hits"] == 4
    assert data["tiers"]["memory"]["hit_tokens"] == 1024
    assert data["tiers"]["disk"]["misses"] == 2
    assert data["lookup_seconds"]["count"] == 1


def test_prometheus_export_reads_the_same_numbers():
    metrics = CacheMetrics(["memory", "disk"], chunk_tokens=16, buckets=[0.001, 0.01])
    metrics.count(1, corrupt_blocks=2, tier_errors=1, dropped_writes=5)
    metrics.observe("read", 0, 0.004, n=4)
    families = _families(metrics)
    corrupt = {s.labels["tier"]: s.value for s in families["kvtier_cache_corrupt_blocks"].samples}
    assert corrupt == {"memory": 0.0, "disk": 2.0}
    reads = [
        s
        for s in families["kvtier_cache_read_seconds"].samples
        if s.labels.get("tier") == "memory" and s.name.endswith("_count")
    ]
    assert reads[0].value == 4.0
    for name in ("dropped_writes", "tier_errors", "evictions", "bytes_read", "hit_tokens"):
        assert f"kvtier_cache_{name}" in families


def test_each_cache_has_its_own_registry():
    one = CacheMetrics(["memory"], 16, [0.01])
    two = CacheMetrics(["memory"], 16, [0.01])
    one.count(0, evictions=3)
    assert one.registry is not two.registry
    assert two.as_dict()["tiers"]["memory"]["evictions"] == 0
    assert 'kvtier_cache_evictions_total{tier="memory"} 3.0' in one.prometheus_text()
    assert 'kvtier_cache_evictions_total{tier="memory"} 0.0' in two.prometheus_text()


def test_a_failing_gauge_never_breaks_an_export():
    metrics = CacheMetrics(["memory"], 16, [0.01])

    def broken():
        raise ConnectionError("tier down")

    metrics.add_gauge("used_bytes", "bytes held", broken)
    metrics.add_gauge("queue_depth", "queued", lambda: [("memory", 3)])
    assert metrics.as_dict()["tiers"]["memory"]["queue_depth"] == 3
    assert "kvtier_cache_queue_depth" in _families(metrics)
