"""Sizing the vLLM job: the prefill fit, the phase estimate, the budget, and the shrinking that
stops at a working set larger than the KV pool and at 2k-token prompts."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.job.vllm_sizing import (
    EngineSpeed,
    PrefillCurve,
    TimeBudget,
    estimate_phase_s,
    size_workload,
    tier_bytes,
    working_set_tokens,
    workload_steps,
)
from kvtier.workloads.longctx import LongContextSpec, Step, scaled

SPEC = LongContextSpec()
POOL = 72 * 128


def speed(tokens_per_s: float, a: float = 0.3, step_s: float = 0.08) -> EngineSpeed:
    return EngineSpeed(PrefillCurve(a, 1 / tokens_per_s), step_s)


def test_the_prefill_fit_recovers_a_curve_and_what_a_hit_saves():
    points = [(n, 0.25 + 6e-4 * n + 2e-8 * n * n) for n in (1024, 2048, 4096)]
    curve = PrefillCurve.fit(points)
    assert curve.a == pytest.approx(0.25, rel=1e-6)
    assert curve.b == pytest.approx(6e-4, rel=1e-6)
    assert curve.c == pytest.approx(2e-8, rel=1e-6)
    assert curve.seconds(3000) == pytest.approx(0.25 + 6e-4 * 3000 + 2e-8 * 9e6)
    assert curve.saved_s(2000) == pytest.approx(6e-4 * 2000 + 2e-8 * 4e6)
    assert curve.saved_s(0) == 0
    line = PrefillCurve.fit([(1000, 1.3), (3000, 3.3)])
    assert (line.a, line.c) == (pytest.approx(0.3), 0.0) and line.b == pytest.approx(1e-3)
    assert line.tokens_per_s(3000) == pytest.approx(3000 / 3.3)
    with pytest.raises(ConfigError, match="two prompt lengths"):
        PrefillCurve.fit([(1000, 1.0), (1000, 1.1)])


def test_a_concave_fit_falls_back_to_a_line():
    curve = PrefillCurve.fit([(1000, 1.0), (2000, 1.9), (4000, 3.0)])
    assert curve.c == 0.0 and curve.b > 0


def test_the_phase_budget_leaves_room_for_the_second_server():
    b = TimeBudget(total_s=300, spent_s=45, next_start_s=45, margin_s=10, kvtier_factor=1.0)
    assert b.phase_s == pytest.approx((300 - 45 - 45 - 10) / 2)
    assert TimeBudget(total_s=10, spent_s=60).phase_s == 0.0


def test_the_working_set_counts_a_shared_prefix_once():
    shared = list(range(1000, 1512))  # 4 blocks of 128
    a = Step("a", 0, [*shared, *range(5000, 5256)], 0.0, 4)
    b = Step("b", 0, [*shared, *range(7000, 7256)], 0.0, 4)
    assert working_set_tokens([a], 128) == 768
    assert working_set_tokens([a, b], 128) == 512 + 2 * 256
    # a prefix shared only after a difference is not shared (keys are chained)
    c = Step("c", 0, [1, *shared[1:], *range(5000, 5256)], 0.0, 4)
    assert working_set_tokens([a, c], 128) == 2 * 768


def test_the_estimate_grows_with_the_workload_and_with_a_slower_engine():
    steps = workload_steps(SPEC)
    fast = estimate_phase_s(SPEC, steps, speed(4000), 4)
    slow = estimate_phase_s(SPEC, steps, speed(1000), 4)
    assert slow > fast > 0
    small = scaled(SPEC, 0.3)
    assert estimate_phase_s(small, workload_steps(small), speed(1000), 4) < slow
    prompt = sum(len(s.prompt) for s in steps)
    # pessimistic: at least every prompt token but the system prompt's, once
    assert slow >= (prompt - len(steps) * SPEC.system_tokens) / 1000


def test_a_fast_engine_runs_the_whole_workload():
    sizing = size_workload(SPEC, speed(50_000, a=0.01, step_s=0.001), 120, POOL, 4)
    assert sizing.scale == 1.0 and sizing.spec == SPEC and sizing.fits
    assert sizing.requests == SPEC.requests() and not sizing.notes


def test_a_slower_engine_shrinks_the_workload_to_the_budget():
    full = size_workload(SPEC, speed(1200), float("inf"), POOL, 4)
    budget = full.estimate_s * 0.8
    sizing = size_workload(SPEC, speed(1200), budget, POOL, 4)
    assert 0 < sizing.scale < 1 and sizing.fits
    assert sizing.estimate_s <= budget
    assert sizing.requests < SPEC.requests() and sizing.prompt_tokens < full.prompt_tokens
    assert sizing.working_set_tokens >= 2.0 * POOL
    steps = workload_steps(sizing.spec)
    assert min(len(s.prompt) for s in steps) >= 2048


def test_shrinking_stops_at_a_working_set_larger_than_the_pool():
    sizing = size_workload(SPEC, speed(50), 30, POOL, 4)
    assert not sizing.fits and "exceeds the phase budget" in sizing.notes[0]
    assert sizing.working_set_tokens >= 2.0 * POOL
    # a little smaller and the pool would hold nearly all of it
    least = scaled(SPEC, max(0.0, sizing.scale - 0.05))
    assert working_set_tokens(workload_steps(least), 128) < 2.0 * POOL
    assert min(len(s.prompt) for s in workload_steps(sizing.spec)) >= 2048


def test_a_pool_larger_than_the_workload_is_said():
    sizing = size_workload(SPEC, speed(50_000), 100, 10 * POOL, 4)
    assert sizing.scale == 1.0 and "working set" in sizing.notes[0]


def test_tier_sizes_make_host_memory_spill_and_the_disk_hold_everything():
    ws_tokens, per_token, chunk = 30_000, 23_040, 256
    dram, disk = tier_bytes(ws_tokens, per_token, chunk)
    ws = ws_tokens * per_token
    assert dram < ws < disk
    assert dram % (1 << 20) == 0 and disk % (1 << 20) == 0
    assert dram >= 4 * chunk * per_token
    with pytest.raises(ConfigError):
        tier_bytes(ws_tokens, per_token, chunk, dram_fraction=1.0)
