"""A simulation calibrated from a `kvtier run` report, replaying that report's requests."""

import json
from pathlib import Path

from kvtier.sim.config import SimConfig
from kvtier.sim.measured import calibrate_from_report, refine_by_replay, replay_error
from kvtier.sim.simulator import simulate
from kvtier.workloads.traces import read_trace

REPORT = Path(__file__).parents[1] / "workloads" / "data" / "kvtier_run_small.json"


def test_the_report_gives_the_engine_tiers_and_timer():
    cal = calibrate_from_report(json.loads(REPORT.read_text()))
    assert cal.engine.pool_blocks == 71 and cal.engine.block_tokens == 128
    assert [t.name for t in cal.tiers] == ["dram", "disk"] and cal.chunk_tokens == 256
    assert cal.timer.step_s > 0 and cal.timer.token_s > 0


def test_a_replay_of_the_report_runs_and_refining_never_makes_it_worse():
    report = json.loads(REPORT.read_text())
    cal = calibrate_from_report(report)
    phases = {
        s: read_trace(REPORT, "kvtier-run", system=s).requests for s in ("vllm", "vllm+kvtier")
    }
    before = replay_error(cal, phases, 4)
    refined = refine_by_replay(cal, phases, 4, evaluations=12)
    assert replay_error(refined, phases, 4) <= before
    config = SimConfig(engine=cal.engine, timer=refined.timer, kvtier=cal.kvtier(), concurrency=4)
    result = simulate(config, phases["vllm+kvtier"])
    assert result.summary["finished"] == len(phases["vllm+kvtier"])


def test_nelder_mead_finds_a_minimum():
    import numpy as np

    from kvtier.sim.measured import nelder_mead

    x, fx = nelder_mead(lambda v: float(np.sum((v - [1.0, -2.0]) ** 2)), np.zeros(2), 1.0, 120)
    assert fx < 1e-4 and np.allclose(x, [1.0, -2.0], atol=0.02)


def test_a_kvtier_calibrate_profile_times_the_steps_and_gives_the_tiers():
    from kvtier.cost.calibration import (
        CalibrationProfile,
        DecodeFit,
        PrefillFit,
        ProfileModel,
        TierFit,
        TransferFit,
    )
    from kvtier.sim.measured import calibrate_from_profile
    from kvtier.workloads.longctx import LongContextSpec
    from kvtier.workloads.longctx_trace import longctx_requests

    model = ProfileModel("m", "f", "bf16", 30, 3, 64, 23040, 256)
    profile = CalibrationProfile(
        model=model,
        prefill=PrefillFit(0.05, 5e-4, 1e-7),
        decode=DecodeFit(0.05, 0.002, 1e-7),
        tiers={"dram": TierFit("dram", "slab:///dev/shm/x", TransferFit(1e-3, 2e9))},
    )
    cal = calibrate_from_profile(profile.to_dict(), pool_blocks=80)
    assert cal.timer.step_seconds([(1024, 0)], ()) == profile.prefill.seconds(1024, 0)
    assert [t.name for t in cal.tiers] == ["dram"] and cal.engine.pool_blocks == 80
    reqs = longctx_requests(LongContextSpec(), block_tokens=128)
    config = SimConfig(engine=cal.engine, timer=cal.timer, kvtier=cal.kvtier(), concurrency=4)
    result = simulate(config, reqs)
    assert result.summary["finished"] == len(reqs) and result.summary["hit_tokens"].get("dram")


def _contention_fitted_on_the_report():
    """The report's calibration with contention fitted on its own concurrency-4 replay."""
    from kvtier.sim.measured import fit_contention

    cal = calibrate_from_report(json.loads(REPORT.read_text()))
    phases = {
        s: read_trace(REPORT, "kvtier-run", system=s).requests for s in ("vllm", "vllm+kvtier")
    }
    return fit_contention(cal, [(phases, 4)], evaluations=6)


def test_contention_is_fitted_from_a_run_at_concurrency_and_zero_when_it_does_not_help():
    fitted = _contention_fitted_on_the_report()
    info = fitted.fits["contention"]
    assert fitted.frontend is not None and fitted.frontend.contention == info["value"] >= 0
    assert info["error"] <= info["error_without"]


def test_connector_costs_are_what_the_kvtier_phase_adds_beyond_the_timers_prefill():
    from kvtier.sim.measured import fit_connector_costs
    from kvtier.sim.timing import MeasuredTimer

    timer = MeasuredTimer(step_s=0.03, token_s=2e-4, request_overhead_s=0.0, budget=2048)
    requests, sent = [], 0.0
    for i, (prompt, cached, wait) in enumerate(
        [(1600, 0, 0.0), (1800, 1536, 0.02), (2000, 1792, 0.0), (2400, 384, 0.0),
         (1700, 1280, 0.01), (2200, 1024, 0.03), (1900, 256, 0.0)]
    ):  # fmt: skip
        new = prompt - cached
        server = timer.prefill_seconds(new, cached) + wait + 0.025 + 5e-5 * new
        line = {"local_hit_tokens": cached, "loaded_tokens": 0, "load_wait_s": wait}
        requests.append(
            {"sent_s": sent, "e2e_s": server + 0.1, "prompt_tokens": prompt, "connector": line,
             "server": {"time_to_first_token_ms": server * 1e3}, "ttft_s": server}
        )  # fmt: skip
        sent += 10.0 + i
    report = {"phases": [{"system": "vllm+kvtier", "requests": requests}]}
    costs = fit_connector_costs(report, timer)
    assert abs(costs["request_cost_s"] - 0.025) < 1e-6
    assert abs(costs["token_cost_s"] - 5e-5) < 1e-9


def _engine_alone_report(timer, noise):
    """A report whose engine-alone requests ran alone and took their prefill × ``noise``."""
    requests, sent = [], 0.0
    for i, factor in enumerate(noise):
        prompt, cached = 1200 + 100 * (i % 5), 0
        server = timer.prefill_seconds(prompt, cached) * factor
        requests.append(
            {"sent_s": sent, "e2e_s": server + 0.1, "prompt_tokens": prompt, "cached_tokens": 0,
             "server": {"time_to_first_token_ms": server * 1e3}, "ttft_s": server}
        )  # fmt: skip
        sent += 10.0
    return {"phases": [{"system": "vllm", "requests": requests}]}


def test_jitter_is_the_robust_spread_of_the_engines_measured_prefills():
    import numpy as np

    from kvtier.sim.measured import fit_jitter
    from kvtier.sim.timing import MeasuredTimer

    timer = MeasuredTimer(step_s=0.03, token_s=2e-4, request_overhead_s=0.0, budget=2048)
    assert fit_jitter(_engine_alone_report(timer, [1.0] * 12), timer) == 0.0
    noise = np.exp(0.2 * np.random.default_rng(3).standard_normal(400))
    assert abs(fit_jitter(_engine_alone_report(timer, noise), timer) - 0.2) < 0.03
    assert fit_jitter(_engine_alone_report(timer, noise[:5]), timer) == 0.0  # too few


def test_a_jittering_replay_pools_seeded_replays_and_repeats_itself():
    from dataclasses import replace

    from kvtier.sim.config import FrontendSpec
    from kvtier.sim.replays import REPLAYS, replay

    from .helpers import config, request

    reqs = [request(2.0 * i, 200 + 16 * (i % 4), tag=str(i)) for i in range(30)]
    steady = config(concurrency=1)
    once = replay(steady, reqs)
    assert once.replays == 1 and once.ttft_s == simulate(steady, reqs).summary["ttft_s"]
    shaky = replace(steady, frontend=FrontendSpec(jitter=0.3))
    pooled = replay(shaky, reqs)
    again = replay(shaky, reqs)
    assert pooled.replays == REPLAYS and (again.ttft_s, again.e2e_s) == (
        pooled.ttft_s,
        pooled.e2e_s,
    )
    assert pooled.ttft_s["p95"] > once.ttft_s["p95"]  # the draws spread the tail
    assert replay(replace(shaky, seed=5), reqs).ttft_s != pooled.ttft_s


def test_a_negative_jitter_is_refused():
    import pytest

    from kvtier.errors import ConfigError
    from kvtier.sim.config import FrontendSpec

    with pytest.raises(ConfigError, match="jitter"):
        FrontendSpec(jitter=-0.1)


def test_the_connectors_contention_is_fitted_on_the_kvtier_phase_after_the_engines():
    fitted = _contention_fitted_on_the_report()
    engine, connector = fitted.fits["contention"], fitted.fits["connector_contention"]
    assert fitted.connector_costs["contention"] == connector["value"] >= -engine["value"]
    assert connector["error"] <= connector["error_without"]
    assert fitted.kvtier().contention == connector["value"]
