"""`kvtier bench codec`: every method gives the bytes back, JSON only on stdout, a PNG plot,
one-line refusals; the real corpus comes from the model's KV, chunked as the tiers store it."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest

from kvtier.bench.codec import CodecBenchConfig, measure, methods, synthetic_corpora
from kvtier.cli.main import app
from kvtier.testing.cli import run_cli

#: The CLI run in-process: kvtier(monkeypatch, capsys, *args) → (exit code, stdout, stderr).
kvtier = partial(run_cli, app)


def test_every_method_round_trips_every_synthetic_corpus():
    corpora = synthetic_corpora(1, shape=(4, 2, 3, 256, 64))
    for name, blocks in corpora.items():
        for method in methods((1,), with_zipnn=False):
            result = measure(name, blocks[:1], method, threads=2, repeats=1)
            assert result.exact, (name, method.name)
            assert result.ratio > 0 and result.decode_gbps_core > 0
    random = [measure("r", corpora["random-bytes"], m, 1, 1) for m in methods((1,), False)]
    assert all(r.ratio <= 1.0 for r in random)  # nothing to gain in random bytes


def test_json_and_plot(monkeypatch, capsys, tmp_path):
    plot = tmp_path / "codec.png"
    code, out, err = kvtier(
        monkeypatch, capsys,
        "bench", "codec", "--no-real", "--synthetic", "1", "--repeat", "1",
        "--zstd-levels", "1", "--json", "--plot", str(plot),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    names = {r["method"] for r in data["results"]}
    assert {"raw", "zstd-1", "byteplane+zstd-1", "kvtier-kv"} <= names
    assert all(r["exact"] for r in data["results"])
    assert "ratio/zstd-1" in data["against"]["synthetic-bf16"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # stderr is no terminal here: one progress line a step, stdout only JSON
    assert "methods on synthetic-bf16" in err and err.count(" s] ") >= 3


@pytest.mark.parametrize(
    "args",
    [["--dtypes", "fp64"], ["--kinds", "poetry"], ["--lengths", "100"], ["--zstd-levels", "x"]],
)
def test_bad_options_are_one_line_exit_2(monkeypatch, capsys, args):
    code, out, err = kvtier(monkeypatch, capsys, "bench", "codec", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_config_refuses_impossible_values():
    with pytest.raises(ValueError):
        CodecBenchConfig(threads=0)
    with pytest.raises(ValueError):
        CodecBenchConfig(zstd_levels=(99,))
    assert np.isfinite(CodecBenchConfig().threads)
