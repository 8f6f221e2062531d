"""`kvtier bench storage` through the real CLI: JSON only on stdout, table, one-line errors."""

from __future__ import annotations

import json
from functools import partial

from kvtier.cli.main import app
from kvtier.testing.cli import run_cli

#: The CLI run in-process: kvtier(monkeypatch, capsys, *args) → (exit code, stdout, stderr).
kvtier = partial(run_cli, app)


def tiny(tmp_path) -> list[str]:
    return [
        "bench", "storage",
        "--tier", "memory://?size=16MiB",
        "--tier", f"file://{tmp_path}?size=16MiB",
        "--block-size", "256KiB", "--data-size", "1MiB", "--depth", "1,2",
        "--repeat", "1", "--min-read-seconds", "0",
    ]  # fmt: skip


def test_json_run_prints_only_json(monkeypatch, capsys, tmp_path):
    code, out, err = kvtier(monkeypatch, capsys, *tiny(tmp_path), "--no-lookup", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["benchmark"] == "storage"
    assert len(data["results"]) == 2 * 2 * 2
    assert all(r["bytes"] == 4 * 256 * 1024 for r in data["results"])
    assert data["lookup"] is None


def test_table_run_and_plot(monkeypatch, capsys, tmp_path):
    png = tmp_path / "out.png"
    args = [*tiny(tmp_path / "d"), "--depth", "2", "--lookup-chunks", "16", "--plot", str(png)]
    code, out, err = kvtier(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "kvtier bench storage" in out and "16 chunks" in out and "GB/s" in out
    assert png.stat().st_size > 0 and "plot saved" in err


def test_bad_options_are_one_line_errors(monkeypatch, capsys, tmp_path):
    code, out, err = kvtier(monkeypatch, capsys, *tiny(tmp_path), "--depth", "1,x")
    assert code == 2 and "depths" in err and "Traceback" not in err
    code, out, err = kvtier(
        monkeypatch, capsys, "bench", "storage", "--tier", "memory://?size=1MiB"
    )
    assert code == 2 and "size=" in err and out == ""
    # a tier with no codec has nothing to compare with its raw twin: refused before any I/O
    code, out, err = kvtier(monkeypatch, capsys, *tiny(tmp_path), "--reference", "raw")
    assert code == 2 and "no codec" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_bench_help_lists_storage(monkeypatch, capsys):
    code, out, _ = kvtier(monkeypatch, capsys, "bench", "--help")
    assert code == 0 and "storage" in out
