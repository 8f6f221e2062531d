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
    assert cal.engine.pool_blocks == 72 and cal.engine.block_tokens == 128
    assert [t.name for t in cal.tiers] == ["dram", "disk"] and cal.chunk_tokens == 256
    assert cal.timer.step_s > 0 and cal.timer.token_s > 0


def test_a_replay_of_the_report_runs_and_refining_never_makes_it_worse():
    report = json.loads(REPORT.read_text())
    cal = calibrate_from_report(report)
    phases = {
        s: read_trace(REPORT, "kvtier-run", system=s).requests for s in ("vllm", "vllm+kvtier")
    }
    before = replay_error(cal, cal.timer, phases, 4)
    refined = refine_by_replay(cal, phases, 4, rounds=1)
    assert replay_error(refined, refined.timer, phases, 4) <= before
    config = SimConfig(engine=cal.engine, timer=refined.timer, kvtier=cal.kvtier(), concurrency=4)
    result = simulate(config, phases["vllm+kvtier"])
    assert result.summary["finished"] == len(phases["vllm+kvtier"])
