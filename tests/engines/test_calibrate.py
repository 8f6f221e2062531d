"""A real (short) calibration of the embedded model, memory and disk tiers; the CLI command."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from kvtier.cli.main import cli  # noqa: E402
from kvtier.cost import ComputeModel  # noqa: E402
from kvtier.cost.calibration import CalibrationProfile  # noqa: E402
from kvtier.engines.calibrate import CalibrationPlan, calibrate, calibration_keys  # noqa: E402
from kvtier.errors import ConfigError  # noqa: E402
from kvtier.keys import Namespace  # noqa: E402
from kvtier.tiers.registry import open_tier  # noqa: E402

SHORT = CalibrationPlan(
    max_tokens=128, compute_budget_s=5.0, repeats=1, chunk_tokens=32, load_chunks=(1, 2, 4)
)
NS = Namespace("kvtier-calibration", "synthetic", "fp32", 1, 1, 1)


@pytest.mark.slow
def test_short_calibration_gives_a_usable_profile(smol_fp32, tmp_path):
    urls = ["memory://?size=64MiB", f"file://{tmp_path / 'disk'}?size=64MiB&sync=0"]
    tiers = [(url, open_tier(url, NS.id)) for url in urls]
    stages = []
    try:
        profile = calibrate(smol_fp32, tiers, SHORT, lambda s, d, t: stages.append(s))
        for _, tier in tiers:  # the synthetic blocks are gone again
            assert not any(tier.contains_many(calibration_keys(4)))
    finally:
        for _, tier in tiers:
            tier.close()
    assert {"prefill", "decode", "device copy", "tiers"} <= set(stages)
    assert profile.model.kv_dtype == "fp32" and profile.model.kv_bytes_per_token == 46080
    assert profile.model.fingerprint == smol_fp32.fingerprint
    assert {n for n, p, _ in profile.prefill.samples if p == 0} >= {16, 32, 64}
    assert any(p > 0 for _, p, _ in profile.prefill.samples)

    compute = profile.compute
    assert isinstance(compute, ComputeModel)
    lengths = [1, 16, 128, 1024, 8192]
    times = [compute.prefill_seconds(n) for n in lengths]
    assert all(t > 0 for t in times)
    assert times == sorted(times) and len(set(times)) == len(times)
    assert compute.prefill_seconds(64, 4096) >= compute.prefill_seconds(64, 0)
    assert compute.decode_step_seconds(128) > 0

    assert set(profile.tiers) == {"memory", "disk"}
    for name, path in profile.paths().items():
        assert path.device_bandwidth == profile.device_copy.bandwidth
        small, large = path.seconds(1 << 20), path.seconds(1 << 28)
        assert 0 < small < large, name
    cost = profile.cost_model()
    assert cost.recompute_seconds(512) == compute.prefill_seconds(512)
    assert CalibrationProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


def test_plan_is_checked():
    assert CalibrationPlan(max_tokens=100, min_tokens=16).lengths() == [16, 32, 64, 100]
    with pytest.raises(ConfigError):
        CalibrationPlan(max_tokens=8, min_tokens=16)
    with pytest.raises(ConfigError):
        CalibrationPlan(load_chunks=())


@pytest.mark.slow
def test_calibrate_command_saves_and_prints_a_profile(smol_fp32, tmp_path):
    out = tmp_path / "profile.json"
    args = [
        "calibrate",
        "--dtype",
        "fp32",
        "--max-tokens",
        "64",
        "--budget",
        "3",
        "--repeats",
        "1",
        "--chunk-tokens",
        "32",
        "--load-chunks",
        "1,2",
        "--dir",
        str(tmp_path / "disk"),
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert CalibrationProfile.load(out).to_dict() == printed
    assert set(printed["tiers"]) == {"memory", "disk"}
    assert not (tmp_path / "disk").exists()  # the default disk tier's directory is cleaned up


def test_calibrate_summary_and_bad_options(tmp_path, capsys):
    from kvtier.cli.calibrate_cmd import _summary
    from kvtier.cost.calibration import PrefillFit, ProfileModel, TierFit, TransferFit

    profile = CalibrationProfile(
        model=ProfileModel("m", "f", "bf16", 2, 1, 4, 32, 16),
        prefill=PrefillFit(0.01, 1e-3, 1e-7),
        device_copy=TransferFit(1e-6, 1e10),
        tiers={"disk": TierFit("disk", "file:///x", TransferFit(1e-4, 1e9), ("buffered",))},
        host={"device": "cpu"},
    )
    _summary(profile, tmp_path / "p.json")
    shown = capsys.readouterr().out
    assert "break-even" in shown and "disk" in shown and "buffered" in shown
    bad = CliRunner().invoke(cli, ["calibrate", "--load-chunks", "x"])
    assert bad.exit_code != 0 and "load-chunks" in str(bad.exception or bad.output)
