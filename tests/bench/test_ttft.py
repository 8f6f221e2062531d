"""`kvtier bench ttft` on a tiny sweep with the real (fp32) model: cells, targets, JSON.

Not timing targets (the machine is shared while tests run): the structure, the decision's
bookkeeping and the verdict rules.
"""

from __future__ import annotations

import json
import sys

import pytest

from kvtier.bench.ttft import Cell, TTFTBench, TTFTBenchConfig, TTFTReport
from kvtier.cli.main import app


def _cell(**kw) -> Cell:
    base = dict(
        prefix_tokens=256,
        tier="dram",
        prompt_tokens=288,
        recompute_s=1.0,
        load_s=0.2,
        load_chunks=4,
        action="load",
        chosen_chunks=4,
        predicted_s=0.22,
        predicted_recompute_s=1.1,
        predicted_load_s=0.22,
    )
    base.update(kw)
    return Cell(**base)


def test_cell_verdicts():
    good = _cell()
    assert good.chosen_s == 0.2 and good.correct(0.05) and good.error == pytest.approx(0.1)
    wrong = _cell(action="recompute", chosen_chunks=0, predicted_s=1.1)
    assert wrong.chosen_s == 1.0 and not wrong.correct(0.05)
    tie = _cell(action="recompute", chosen_chunks=0, load_s=0.98)
    assert tie.correct(0.05)  # within 5 % of the fastest path: a near-tie counts as right
    partial = _cell(action="partial", chosen_chunks=2, partial_s=0.5, load_s=0.2)
    assert partial.chosen_s == 0.5 and not partial.correct(0.05)
    short = _cell(prefix_tokens=16, load_s=None, load_chunks=0, action="recompute")
    assert short.chosen_s == short.fastest_s == 1.0 and short.correct(0.0)


def test_targets_are_judged_against_the_issue():
    report = TTFTReport(
        config={},
        model={},
        profile={},
        cells=[_cell(), _cell(tier="disk", load_s=0.3, predicted_s=0.5)],
        reuse={
            "prefix_tokens": 8192,
            "reuse_s": 0.5,
            "recompute_s": 20.0,
            "speedup": 40.0,
            "bound_ratio": 1.2,
            "new_tokens": 32,
            "new_prefill_s": 0.4,
            "kv_bytes": 1e8,
            "copy_bandwidth": 1e10,
            "copy_s": 0.01,
        },
        miss={
            "overhead": 0.01,
            "kvtier_median_s": 1.01,
            "plain_median_s": 1.0,
            "pairs": 3,
            "prompt_tokens": 256,
            "spread": 0.02,
            "direct_s": 0.001,
            "direct_overhead": 0.001,
        },
        break_even={},
        tie=0.05,
    )
    verdicts = {t.name: t.passed for t in report.targets()}
    assert verdicts == {
        "reuse from DRAM vs recompute": True,
        "reuse TTFT / (new-token prefill + KV copy)": False,
        "miss: TTFT added by kvtier": True,
        "decision picks the faster path": True,
        "predicted TTFT within 20 % of measured": False,  # the disk cell is off by 67 %
    }
    assert json.loads(json.dumps(report.to_dict()))["targets"][1]["verdict"] == "MISS"


@pytest.mark.slow
@pytest.mark.parametrize("exact", [False, True])
def test_tiny_sweep(exact, embedded_fp32_tok, tiny_profile, tmp_path):
    config = TTFTBenchConfig(
        exact=exact,
        dtype="fp32",
        lengths=(16, 32, 64),
        chunk_tokens=32,
        new_tokens=8,
        directory=tmp_path / "tiers",
        dram_size="64MiB",
        disk_size="256MiB",
        repeats=1,
        miss_tokens=32,
        miss_pairs=2,
        profile_path=tiny_profile,
        guard=False,  # tests share the CPU: no waiting for quiet
    )
    bench = TTFTBench(config, loaded=embedded_fp32_tok)
    steps = []
    bench.on_step = steps.append
    report = bench.run()
    assert len(steps) == bench.steps()
    assert [(c.prefix_tokens, c.tier) for c in report.cells] == [
        (p, t) for p in (16, 32, 64) for t in ("dram", "disk")
    ]
    for cell in report.cells:
        assert cell.recompute_s > 0 and cell.predicted_s > 0
        assert cell.action in ("load", "partial", "recompute")
        if cell.prefix_tokens < 32:
            assert cell.load_s is None and cell.action == "recompute" and cell.note
        else:
            assert cell.load_s > 0 and cell.load_chunks == cell.prefix_tokens // 32
    assert report.reuse["prefix_tokens"] == 64 and report.reuse["reused_tokens"] == 64
    assert report.reuse["speedup"] > 0 and report.reuse["copy_bandwidth"] > 0
    assert report.miss["pairs"] == 2 and len(report.miss["kvtier_s"]) == 2
    assert -0.01 < report.miss["direct_s"] < min(report.miss["kvtier_s"])
    doc = json.loads(json.dumps(report.to_dict()))
    assert [t["verdict"] in ("PASS", "MISS") for t in doc["targets"]] == [True] * 5
    assert set(doc["break_even"]) == {"dram", "disk"}
    assert doc["config"]["exact"] is exact
    assert not any((tmp_path / "tiers").glob("*/*/*.kvb"))  # the tiers' blocks are cleaned up


def test_bad_lengths_are_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kvtier", "bench", "ttft", "--lengths", "64,x"])
    with pytest.raises(SystemExit) as exc:
        app()
    assert exc.value.code == 2
    assert "--lengths" in capsys.readouterr().err


def test_quiet_guard_reruns_disturbed_measurements():
    from kvtier.bench.ttft import QuietGuard

    # each check is the faster of two canaries; the reference is the fastest check so far
    start = [0.1, 0.12, 0.11, 0.1, 0.1, 0.1]
    first = [0.1, 0.3, 0.5, 0.4, 0.2, 0.1, 0.1, 0.1]  # check pairs: quiet, busy, quiet, quiet
    canaries = iter(start + first + [0.5] * 40)
    guard = QuietGuard(lambda: next(canaries), factor=1.5, tries=3, max_wait_s=0.0)
    assert guard.reference == 0.1
    runs = iter([2.0, 1.0, 7.0, 8.0, 6.0])
    # first try: quiet before, contended after; second try: quiet before and after
    assert guard.measure(lambda: next(runs)) == 1.0
    assert guard.retries == 1 and guard.disturbed_runs == 0
    # never quiet again: three tries, the fastest kept, and counted as disturbed
    assert guard.measure(lambda: next(runs)) == 6.0
    assert guard.retries == 4 and guard.disturbed_runs == 1
    assert guard.last_check == 0.5 and guard.disturbed(guard.last_check)
    assert not guard.disturbed(0.14)
    off = QuietGuard(lambda: 1 / 0, enabled=False)  # disabled: no canary at all
    assert off.measure(lambda: 3.0) == 3.0 and not off.disturbed(99.0)
