"""``kvtier bench reload``'s config checks and the figures its report derives."""

from __future__ import annotations

import pytest

from kvtier.bench.reload import ReloadConfig, ReloadReport, Sample
from kvtier.errors import ConfigError


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"mode": "both"}, "--mode is one of restart, pd"),
        ({"tp": 0}, "at least 1"),
        ({"prompt_tokens": 300}, "at least two chunks"),
        ({"shared": "redis://127.0.0.1:1/0"}, "--mode pd"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kw, message):
    with pytest.raises(ConfigError, match=message):
        ReloadConfig(**kw)


def test_the_speedup_is_the_fresh_median_over_the_held_one_and_needs_every_load_whole():
    config = ReloadConfig(prompts=2, prompt_tokens=1100)
    report = ReloadReport(config)
    report.samples = [
        Sample("held", 0.2, loaded_tokens=1024),
        Sample("fresh", 1.0),
        Sample("fresh", 1.2),
        Sample("held", 0.4, loaded_tokens=1024),
    ]
    data = report.to_dict()
    assert data["speedup"] == pytest.approx(1.1 / 0.3)
    assert data["all_loaded"] and data["passed"]
    report.samples[3].failed_blocks = 2  # one load failed: it recomputed
    assert not report.to_dict()["passed"]
    report.samples[3] = Sample("held", 0.4, loaded_tokens=768)  # not all of it loaded
    assert not report.all_loaded()
    assert ReloadConfig(prompt_tokens=4160).max_model_len == 4224


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mode", "both"], "--mode is one of restart, pd"),
        (["--mode", "pd", "--shared", "redis://127.0.0.1:1/0"], "does not answer"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line_before_any_engine_starts(
    args, message, monkeypatch, capsys, tmp_path
):
    from kvtier.cli.main import app
    from kvtier.testing.cli import run_cli

    code, out, err = run_cli(
        app, monkeypatch, capsys, "bench", "reload", "--dir", str(tmp_path), *args
    )
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.log"))  # no engine was started
