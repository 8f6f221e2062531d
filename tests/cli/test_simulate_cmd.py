"""`kvtier simulate`: a trace replay, --json, --csv, --plot, a sweep, a run's replay compared,
and bad input refused in one line with exit 2 before anything runs."""

import csv
import io
import json
from functools import partial
from pathlib import Path

import pytest

from kvtier.cli.main import app
from kvtier.testing.cli import run_cli

kvtier = partial(run_cli, app)
DATA = Path(__file__).parents[1] / "workloads" / "data"
MOONCAKE = DATA / "mooncake_head200.jsonl"
RUN = DATA / "kvtier_run_small.json"


def test_a_mooncake_trace_replays_with_every_figure(monkeypatch, capsys, tmp_path):
    code, out, err = kvtier(
        monkeypatch, capsys, "simulate", "--trace", str(MOONCAKE), "--json", "--records",
        "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    s = doc["summary"]
    assert s["requests"] == 200 == len(doc["requests"]) and s["finished"] > 0
    for key in ("ttft_s", "tpot_s", "e2e_s", "goodput", "gpu_time", "hit_rate", "links", "tiers"):
        assert key in s
    assert {"dram[0]", "nvme[0]"} <= set(s["tiers"]) and s["tiers"]["nvme[0]"]["rated_dwpd"]
    assert doc["config"]["engine"]["block_tokens"] == 512  # the trace's own granularity
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert len(rows) == 200 and "ttft_s" in rows[0]
    assert (tmp_path / "simulate.png").stat().st_size > 0


def test_a_sweep_gives_a_row_per_value_and_the_memory_wall_plot(monkeypatch, capsys, tmp_path):
    code, out, err = kvtier(
        monkeypatch, capsys, "simulate", "--trace", str(MOONCAKE), "--sweep", "dram=0,64GB",
        "--json", "--plot", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["dram"] for r in rows] == ["0", "64GB"]
    assert (tmp_path / "sweep-dram.png").stat().st_size > 0


def test_two_sweeps_draw_each_routing_against_the_replicas(monkeypatch, capsys, tmp_path):
    code, out, err = kvtier(
        monkeypatch, capsys, "simulate", "--trace", str(MOONCAKE), "--sweep", "replicas=1,4",
        "--sweep", "routing=round-robin,prefix,tier", "--json", "--plot", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["sweep"], doc["series"]) == ("replicas", "routing")
    rows = doc["rows"]
    assert [(r["replicas"], r["routing"]) for r in rows] == [
        (n, p) for n in ("1", "4") for p in ("round-robin", "prefix", "tier")
    ]
    for r in rows:
        assert r["hit_share"] == pytest.approx(sum(r["hit_rate"].values()))
    one = [r for r in rows if r["replicas"] == "1"]
    assert len({json.dumps(r["hit_rate"], sort_keys=True) for r in one}) == 1  # one engine
    by = {(r["replicas"], r["routing"]): r for r in rows}
    assert by["4", "prefix"]["hit_share"] > by["4", "round-robin"]["hit_share"]
    assert (tmp_path / "sweep-replicas-routing.png").stat().st_size > 0


def test_a_run_report_replays_beside_what_it_measured(monkeypatch, capsys):
    code, out, err = kvtier(
        monkeypatch, capsys, "simulate", "--calibration", str(RUN), "--trace", str(RUN),
        "--trace-format", "kvtier-run", "--compare", "--no-refine", "--json",
    )  # fmt: skip
    assert code == 0, err
    phases = json.loads(out)["phases"]
    assert [p["system"] for p in phases] == ["vllm", "vllm+kvtier"]
    for p in phases:
        assert p["ttft_s"]["measured"]["p50"] > 0 and p["ttft_s"]["simulated"]["p50"] > 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--trace", "/nonexistent/trace.jsonl"], "/nonexistent/trace.jsonl"),
        (["--trace", str(RUN), "--trace-format", "csv"], "unknown trace format"),
        (["--gpu", "h999"], "unknown GPU"),
        (["--sweep", "colour=red"], "cannot sweep"),
        (["--sweep", "concurrency"], "NAME=V1"),
        (["--routing", "nearest"], "session, least-loaded, round-robin, prefix, tier"),
        (["--sweep", "routing=session,nearest"], "not 'nearest'"),
        (["--sweep", "replicas=two"], "'two' is not a number"),
        (["--sweep", "replicas=0"], "at least 1"),
        (["--sweep", "replicas=1", "--sweep", "replicas=2"], "swept twice"),
        (["--sweep", "replicas=1", "--sweep", "routing=tier", "--sweep", "dram=0"], "or two"),
        (["--concurrency", "0"], "at least 1"),
        (["--dram", "lots"], "--dram"),
        (["--preemption", "swap"], "recompute, offload or auto"),
        (["--calibration", "/nonexistent.json"], "/nonexistent.json"),
        (["--csv", "/proc/x.csv"], "/proc/x.csv"),
        (["--compare"], "kvtier-run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, args, says):
    code, _, err = kvtier(monkeypatch, capsys, "simulate", *args)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_malformed_trace_line_names_its_line_or_is_skipped(monkeypatch, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = MOONCAKE.read_text().splitlines()[:5]
    lines.insert(2, '{"timestamp": 5, "input_length": "many"}')
    trace.write_text("\n".join(lines) + "\n")
    code, _, err = kvtier(monkeypatch, capsys, "simulate", "--trace", str(trace))
    assert code == 2 and ":3:" in err
    code, out, err = kvtier(monkeypatch, capsys, "simulate", "--trace", str(trace), "--skip-bad",
                            "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["config"]["source"]["skipped_lines"] == 1
