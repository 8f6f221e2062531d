"""The connector's cost model: load everything until measured, then the cheaper cut."""

from __future__ import annotations

import kvtier.engines.vllm.costs as costs_mod
from kvtier.engines.vllm.costs import EXPLORE_EVERY, MIN_LOADS, REFIT_S, OnlineCosts

CHUNK = 256
CHUNK_BYTES = 6 << 20


def _measured(bytes_per_s: float) -> OnlineCosts:
    costs = OnlineCosts(("host", "disk"), CHUNK, CHUNK_BYTES)
    for new in (256, 512, 1024, 2048, 4096):  # 1 ms per token of prefill
        costs.observe_prefill(new, 0, new * 1e-3)
    for _ in range(MIN_LOADS):
        costs.observe_load("host", 10 * CHUNK_BYTES, 10 * CHUNK_BYTES / bytes_per_s, 10)
        costs.observe_load("disk", 10 * CHUNK_BYTES, 10 * CHUNK_BYTES / bytes_per_s, 10)
    return costs


def test_before_any_measurement_every_hit_is_loaded():
    costs = OnlineCosts(("host", "disk"), CHUNK, CHUNK_BYTES)
    want, decision = costs.decide(2000, 1, ["host", "disk", "disk"])
    assert (want, decision) == (4, None)


def test_a_fast_tier_is_loaded_and_a_slow_one_recomputed():
    fast = _measured(10e9)  # a chunk in 0.6 ms vs 256 ms of prefill
    want, decision = fast.decide(2000, 0, ["host"] * 7)
    assert want == 7 and decision is not None and decision.action == "load"
    slow = _measured(1e6)  # a chunk in 6 s: recompute
    want, decision = slow.decide(2000, 0, ["disk"] * 7)
    assert want == 0 and decision.action == "recompute"


def test_chunks_vllm_already_holds_are_never_given_up_and_queued_loads_count():
    costs = _measured(50e6)  # a chunk in ~0.13 s vs 0.256 s of prefill: loading pays
    want, _ = costs.decide(2000, 2, ["disk"] * 5)
    assert want == 7
    # behind 60 s of queued disk reads, recomputing the rest is faster
    want, _ = costs.decide(2000, 2, ["disk"] * 5, {"disk": 3e9})
    assert want == 2


def test_measurements_are_reported():
    costs = _measured(1e9)
    assert costs.prefill_samples == 5 and not costs.as_dict()["prefill_fitted"]
    assert costs.measured  # a decision (or this) fits the curve
    info = costs.as_dict()
    assert info["prefill_fitted"] and info["prefill_samples"] == 5
    assert abs(info["tier_bytes_per_s"]["disk"] - 1e9) < 1e3


def test_one_slow_first_load_does_not_condemn_a_tier():
    costs = OnlineCosts(("host",), CHUNK, CHUNK_BYTES)
    for new in (256, 512, 1024, 2048, 4096):
        costs.observe_prefill(new, 0, new * 1e-3)
    costs.observe_load("host", CHUNK_BYTES, 10.0, 1)  # a cold first read: 10 s for one chunk
    want, decision = costs.decide(2000, 0, ["host"] * 7)
    assert (want, decision) == (7, None)  # still unmeasured: load, and so measure again
    for _ in range(MIN_LOADS):
        costs.observe_load("host", CHUNK_BYTES, CHUNK_BYTES / 10e9, 1)
    want, decision = costs.decide(2000, 0, ["host"] * 7)
    assert want == 7 and decision is not None and decision.action == "load"


def test_a_tier_passed_over_for_long_is_loaded_again_to_measure_it():
    slow = _measured(1e6)
    actions = [slow.decide(2000, 0, ["disk"] * 7)[1] for _ in range(EXPLORE_EVERY + 1)]
    assert all(a is not None and a.action == "recompute" for a in actions[:EXPLORE_EVERY])
    assert actions[EXPLORE_EVERY] is None  # the explore round loads every hit
    assert slow.decide(2000, 0, ["disk"] * 7)[1].action == "recompute"


def test_samples_cost_no_fit_until_a_decision_and_refits_are_spaced(monkeypatch):
    fits = []
    real = costs_mod.robust_prefill_fit
    monkeypatch.setattr(costs_mod, "robust_prefill_fit", lambda s: fits.append(len(s)) or real(s))
    now = [100.0]
    costs = OnlineCosts(("host",), CHUNK, CHUNK_BYTES, clock=lambda: now[0])
    for new in (256, 512, 1024, 2048, 4096) * 20:  # the step loop's samples: no fit
        costs.observe_prefill(new, 0, new * 1e-3)
    assert fits == [] and costs.prefill_samples == 100
    for _ in range(MIN_LOADS):
        costs.observe_load("host", CHUNK_BYTES, CHUNK_BYTES / 10e9, 1)
    assert costs.decide(2000, 0, ["host"] * 7)[1] is not None and fits == [100]
    costs.observe_prefill(300, 0, 0.3)
    costs.decide(2000, 0, ["host"] * 7)
    assert costs.prefill_seconds(1000) is not None and fits == [100]  # within REFIT_S
    now[0] += REFIT_S
    costs.decide(2000, 0, ["host"] * 7)
    assert fits == [100, 101]  # the new sample is in
    costs.decide(2000, 0, ["host"] * 7)
    now[0] += 10 * REFIT_S
    costs.decide(2000, 0, ["host"] * 7)
    assert fits == [100, 101]  # nothing new: nothing to refit
