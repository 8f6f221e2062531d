"""MLPerf KV-cache traces: the reader on the shipped trace (made by the benchmark itself) and on
broken files; the replay through real tiers; ``kvtier bench trace`` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.bench.trace import TraceConfig, replay
from kvtier.errors import ConfigError
from kvtier.workloads.mlperf import read_trace

from .test_bench_cmd import kvtier

TRACE = Path(__file__).parent / "data" / "mlperf_kv_tiny-1b.csv"


def test_the_shipped_trace_reads_back():
    ops = read_trace(TRACE)
    assert len(ops) == 210
    assert {op.op for op in ops} == {"read", "write"}
    writes = [op for op in ops if op.op == "write"]
    assert len(writes) == 25 and sum(op.size for op in writes) < 400e6
    first = {}
    for op in ops:  # the benchmark reads an object only after writing it
        first.setdefault(op.key, op.op)
    assert set(first.values()) == {"write"}


def test_broken_traces_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="no trace file"):
        read_trace(tmp_path / "none.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n")
    with pytest.raises(ConfigError, match="not an MLPerf KV-cache trace"):
        read_trace(bad)
    bad.write_text(TRACE.read_text().splitlines()[0] + "\n1.0,Write,-5,Tier-2,k,Prefill\n")
    with pytest.raises(ConfigError, match=r"bad.csv:2: not a trace row"):
        read_trace(bad)


def test_replay_through_memory_and_disk(tmp_path):
    ops = read_trace(TRACE)[:30]
    config = TraceConfig(
        tiers=("memory://?size=64MiB", f"slab://{tmp_path}?size=512MiB&sync=0"),
        chunk_bytes=4 << 20,
        bytes_per_token=24576,
    )
    report = replay(ops, config)
    writes = [op for op in ops if op.op == "write"]
    reads = [op for op in ops if op.op == "read"]
    assert (report.writes, report.reads) == (len(writes), len(reads))
    assert report.write_bytes == sum(op.size for op in writes)
    assert report.hits == len(reads) and report.hit_rate == 1.0  # the disk tier holds them all
    assert report.read_bytes == sum(op.size for op in reads)
    figures = report.as_dict()
    assert figures["read_gbps"] > 0 and figures["write_latency"]["p95"] > 0
    assert figures["read_tokens_per_s"] == pytest.approx(
        report.read_bytes / 24576 / report.read_seconds
    )


def test_cli_prints_json_and_refuses_bad_input(monkeypatch, capsys, tmp_path):
    args = ["bench", "trace", "--trace", str(TRACE), "--tier", "memory://?size=256MiB"]
    code, out, err = kvtier(
        monkeypatch, capsys, *args, "--limit", "12", "--bytes-per-token", "24576", "--json"
    )
    assert code == 0, err
    figures = json.loads(out)
    assert figures["reads"] + figures["writes"] == 12
    code, _, err = kvtier(monkeypatch, capsys, *args[:3], str(tmp_path / "x.csv"), *args[4:])
    assert code == 2 and "no trace file" in err and "Traceback" not in err
    code, _, err = kvtier(monkeypatch, capsys, *args, "--model", "nosuch")
    assert code == 2 and "unknown model" in err
