"""The timed pass driver, latency summaries and the plain-copy reference."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kvtier.bench.driver import PassPlan, run_pass
from kvtier.bench.reference import CopyReference
from kvtier.bench.stats import LatencyStats
from kvtier.errors import ConfigError


def test_latency_percentiles_are_ordered_and_match_numpy():
    rng = np.random.default_rng(0)
    samples = rng.lognormal(-7, 1, 1000)
    s = LatencyStats.from_samples(samples)
    assert s.count == 1000
    assert s.p50 <= s.p95 <= s.p99 <= s.max
    assert s.p95 == pytest.approx(np.percentile(samples, 95))
    assert LatencyStats.from_samples([]).count == 0


@pytest.mark.parametrize("items,depth,batch", [(10, 1, 1), (10, 4, 1), (17, 4, 3), (3, 8, 2)])
def test_every_item_is_visited_once_across_threads(items, depth, batch):
    plan = PassPlan(items, 100, depth, batch)
    seen: list[int] = []
    threads: set[str] = set()
    lock = threading.Lock()

    def work(worker: int, indices):
        assert 1 <= len(indices) <= batch
        with lock:
            seen.extend(indices)
            threads.add(threading.current_thread().name)

    res = run_pass(plan, work)
    assert sorted(seen) == list(range(items))
    assert len(threads) == min(depth, items)
    assert res.bytes == items * 100
    assert (
        res.requests
        == res.latency.count
        == sum(len(plan.requests_of(w)) for w in range(plan.threads))
    )
    assert res.seconds > 0


def test_min_seconds_repeats_whole_rounds():
    plan = PassPlan(4, 10, depth=2, min_seconds=0.02)
    res = run_pass(plan, lambda w, idx: None)
    assert res.bytes % (2 * 10) == 0  # each thread repeats its whole share of 2 items
    assert res.seconds >= 0.02
    assert res.bytes > 4 * 10


def test_an_error_in_a_thread_is_raised():
    def work(worker, indices):
        if 5 in indices:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_pass(PassPlan(8, 1, 2), work)


def test_bad_plans_are_config_errors():
    with pytest.raises(ConfigError):
        PassPlan(0, 10)
    with pytest.raises(ConfigError):
        PassPlan(4, 10, depth=0)


def test_copy_reference_really_copies_blocks():
    ref = CopyReference(items=6, item_bytes=4096, batch=2)
    ref.pool[:] = np.arange(6, dtype=np.uint8)[:, None]
    plan = PassPlan(6, 4096, depth=2, batch=2)
    r = ref.read(plan)
    assert r.bytes == 6 * 4096
    # thread 0 reads items 0, 2, 4 in requests [0, 2], [4]: its buffers hold the last request
    bufs = ref.buffers.ensure(2)
    assert (bufs[0][0] == 4).all() and (bufs[0][1] == 2).all()
    for row in bufs:
        for buf in row:
            buf[:] = 9
    w = ref.write(plan)
    assert w.bytes == 6 * 4096
    assert (ref.pool == 9).all()
    ref.close()
