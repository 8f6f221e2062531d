"""The simulator reproduces vLLM's recompute preemption: replaying recorded vLLM runs of an
over-committed workload (``kvtier run --no-kvtier``, a pool far smaller than the requests in
flight need; ``docs/benchmarks/sim/``), each calibrated from another concurrency's run, gives
preemption counts within 25 % of vLLM's own counter (``vllm:num_preemptions_total``)."""

import json
from functools import partial
from pathlib import Path

import pytest

from kvtier.cli.main import app
from kvtier.testing.cli import run_cli

RUNS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "sim" / "runs"
#: judged run → the run its calibration comes from (never itself)
PAIRS = {"px4": "px8", "px6": "px4", "px8": "px6"}

kvtier = partial(run_cli, app)


@pytest.mark.parametrize(("judged", "calibration"), PAIRS.items())
def test_preemptions_match_vllms_counter(monkeypatch, capsys, judged, calibration):
    args = ["simulate", "--trace", str(RUNS / f"{judged}.json"), "--trace-format", "kvtier-run"]
    args += ["--calibration", str(RUNS / f"{calibration}.json"), "--compare", "--json"]
    code, out, err = kvtier(monkeypatch, capsys, *args)
    assert code == 0, err
    (phase,) = json.loads(out)["phases"]
    measured, simulated = phase["preemptions"]["measured"], phase["preemptions"]["simulated"]
    assert measured >= 5  # over-committed: vLLM preempted, or the check means nothing
    assert abs(simulated - measured) <= 0.25 * measured, (measured, simulated)
