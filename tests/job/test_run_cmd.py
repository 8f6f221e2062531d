"""`kvtier run --json` on a tiny workload: JSON only on stdout, plots written; one-line errors."""

from __future__ import annotations

import json
from functools import partial

import pytest

from kvtier.cli.main import app
from kvtier.testing.cli import run_cli

TINY_ARGS = (
    "--engine hf --dtype fp32 --chunk-tokens 32 --system-tokens 64 --chat-sessions 1 "
    "--chat-turns 2 --turn-tokens 16 --docs 1 --doc-tokens 32 --rag-requests 1 "
    "--question-tokens 16 --agent-sessions 0 --max-new-tokens 2 --dram-size 32MiB "
    "--disk-size 256MiB"
).split()


#: The CLI run in-process: kvtier(monkeypatch, capsys, *args) → (exit code, stdout, stderr).
kvtier = partial(run_cli, app)


def _tiny_run(monkeypatch, capsys, tmp_path, tiny_profile, *extra):
    """``kvtier run`` on the tiny workload with plots into ``tmp_path/plots``: (code, out, err,
    plots folder)."""
    plots = tmp_path / "plots"
    code, out, err = kvtier(
        monkeypatch,
        capsys,
        "run",
        *TINY_ARGS,
        "--profile",
        str(tiny_profile),
        "--disk-dir",
        str(tmp_path / "disk"),
        *extra,
        "--plot",
        str(plots),
    )
    return code, out, err, plots


@pytest.mark.slow
def test_run_json_on_a_tiny_workload(monkeypatch, capsys, tmp_path, tiny_profile):
    code, out, err, plots = _tiny_run(monkeypatch, capsys, tmp_path, tiny_profile, "--json")
    assert code == 0, err
    doc = json.loads(out)  # stdout holds the JSON document only
    s = doc["summary"]
    assert s["requests"] == len(doc["requests"]) == 3
    assert sum(s["decisions"]["counts"].values()) == s["requests"]
    assert doc["profile"]["source"] == "loaded"
    assert set(s["tiers"]) == {"dram", "disk"}
    assert sorted(p.name for p in plots.iterdir()) == [
        "run-predictions.png",
        "run-tiers.png",
        "run-ttft.png",
    ]


@pytest.mark.slow
def test_run_without_json_prints_its_tables_and_saves_its_plots(
    monkeypatch, capsys, tmp_path, tiny_profile
):
    code, out, err, plots = _tiny_run(monkeypatch, capsys, tmp_path, tiny_profile)
    assert code == 0, err
    assert not out.lstrip().startswith("{") and "dram" in out  # tables, tier by tier
    assert err.count("plot saved to") == 3 and len(list(plots.iterdir())) == 3


def test_bad_option_is_one_line_exit_2(monkeypatch, capsys):
    code, _, err = kvtier(monkeypatch, capsys, "run", "--chunk-tokens", "0")
    assert code == 2 and "chunk-tokens" in err and "Traceback" not in err
