"""Calibration fits recover known parameters; profiles round-trip through JSON."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from kvtier.cost import ComputeModel, TransferPath
from kvtier.cost.calibration import (
    CalibrationError,
    CalibrationProfile,
    DecodeFit,
    MeasuredCompute,
    PrefillFit,
    ProfileModel,
    TierFit,
    TransferFit,
    default_profile_path,
    fit_decode,
    fit_prefill,
    fit_transfer,
    nnls_relative,
)
from kvtier.errors import ConfigError

TRUE_PREFILL = PrefillFit(a=0.02, b=1.5e-3, c=4e-8)
GRID = [(n, p) for n in (32, 64, 128, 256, 512, 1024) for p in (0, 2048)] + [(2048, 0)]


def _noisy(values, rel: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [v * (1 + rng.uniform(-rel, rel)) for v in values]


def test_prefill_fit_recovers_exact_parameters():
    fit = fit_prefill([(n, p, TRUE_PREFILL.seconds(n, p)) for n, p in GRID])
    assert fit.a == pytest.approx(TRUE_PREFILL.a, rel=1e-6)
    assert fit.b == pytest.approx(TRUE_PREFILL.b, rel=1e-6)
    assert fit.c == pytest.approx(TRUE_PREFILL.c, rel=1e-6)
    assert fit.max_rel_error < 1e-9 and len(fit.samples) == len(GRID)


def test_prefill_fit_tolerates_noise():
    secs = _noisy([TRUE_PREFILL.seconds(n, p) for n, p in GRID], 0.03)
    fit = fit_prefill([(n, p, s) for (n, p), s in zip(GRID, secs, strict=True)])
    for n, p in [(100, 0), (700, 1000), (2000, 0)]:
        assert fit.seconds(n, p) == pytest.approx(TRUE_PREFILL.seconds(n, p), rel=0.05)
    assert fit.max_rel_error < 0.1


def test_fits_never_go_negative():
    # Data with no fixed cost, and a bit of noise that would pull an unconstrained intercept < 0.
    samples = [(n, 0, 1e-3 * n) for n in (10, 100, 1000)] + [(5, 0, 0.0045)]
    fit = fit_prefill(samples)
    assert min(fit.a, fit.b, fit.c) >= 0
    x, _ = nnls_relative(np.array([[1.0, 1.0], [1.0, 2.0]]), np.array([2.0, 1.0]))
    assert np.all(x >= 0)  # falling data: the best non-negative fit is flat


def test_transfer_and_decode_fits_recover_parameters():
    sizes = [2**k for k in range(16, 27, 2)]
    fit = fit_transfer([(b, 50e-6 + b / 8e9) for b in sizes])
    assert fit.latency_s == pytest.approx(50e-6, rel=1e-6)
    assert fit.bandwidth == pytest.approx(8e9, rel=1e-6)
    true = DecodeFit(a=0.01, b=0.004, c=2e-6)
    dec = fit_decode([(ctx, bs, true.seconds(ctx, bs)) for ctx in (64, 512, 2048) for bs in (1, 2)])
    assert (dec.a, dec.b, dec.c) == pytest.approx((true.a, true.b, true.c), rel=1e-6)
    flat = fit_transfer([(1000, 1e-3), (2000, 1e-3)])  # no growth seen: best observed rate
    assert flat.bandwidth == pytest.approx(2e6)


def test_fits_refuse_bad_measurements():
    with pytest.raises(CalibrationError):
        fit_prefill([(1, 0, 0.1), (2, 0, 0.2)])
    with pytest.raises(CalibrationError):
        fit_transfer([(10, 0.0), (20, 1.0)])
    with pytest.raises(ConfigError):
        TRUE_PREFILL.seconds(-1)


def _profile() -> CalibrationProfile:
    return CalibrationProfile(
        model=ProfileModel("smol", "abc", "bf16", 30, 3, 64, 23040, 256),
        prefill=fit_prefill([(n, p, TRUE_PREFILL.seconds(n, p)) for n, p in GRID]),
        decode=DecodeFit(0.01, 0.004, 2e-6, ((64, 1, 0.0141),)),
        device_copy=TransferFit(5e-6, 10e9, ((1 << 20, 1e-4),)),
        tiers={
            "memory": TierFit("memory", "memory://?size=1GiB", TransferFit(20e-6, 6e9)),
            "disk": TierFit("disk", "file:///x?size=1GiB", TransferFit(300e-6, 1.5e9), ("buf",)),
        },
        host={"cpu": "test", "threads": 2},
        created="2025-01-01T00:00:00Z",
    )


def test_profile_round_trips_through_json(tmp_path):
    profile = _profile()
    again = CalibrationProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again == profile
    path = profile.save(tmp_path / "sub" / "profile.json")
    assert CalibrationProfile.load(path) == profile
    assert json.loads(path.read_text())["model"]["kv_dtype"] == "bf16"


def test_profile_serves_the_cost_model():
    profile = _profile()
    compute = profile.compute
    assert isinstance(compute, MeasuredCompute) and isinstance(compute, ComputeModel)
    assert compute.prefill_seconds(512, 1024) == pytest.approx(TRUE_PREFILL.seconds(512, 1024))
    assert compute.decode_step_seconds(64) == pytest.approx(0.01 + 0.004 + 2e-6 * 64)
    assert MeasuredCompute(profile.prefill).decode_step_seconds(10, 2) > 0
    disk = profile.path("disk")
    assert isinstance(disk, TransferPath) and not disk.overlapped
    assert disk.latency_s == pytest.approx(305e-6)
    assert disk.seconds(1e9) == pytest.approx(305e-6 + 1e9 / 1.5e9 + 1e9 / 10e9)
    assert set(profile.paths()) == {"memory", "disk"}
    cost = profile.cost_model()
    assert cost.reload_seconds(profile.path("memory"), 1000) < cost.recompute_seconds(1000)
    assert cost.break_even_tokens(profile.path("memory")) >= 1
    with pytest.raises(ConfigError, match="measured: memory, disk"):
        profile.path("s3")


def test_bad_profiles_are_refused(tmp_path, monkeypatch):
    with pytest.raises(CalibrationError, match="kvtier calibrate"):
        CalibrationProfile.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CalibrationError):
        CalibrationProfile.load(tmp_path / "bad.json")
    data = _profile().to_dict()
    with pytest.raises(CalibrationError, match="version"):
        CalibrationProfile.from_dict({**data, "version": 99})
    del data["prefill"]["a"]
    with pytest.raises(CalibrationError, match="not a valid"):
        CalibrationProfile.from_dict(data)
    monkeypatch.setenv("KVTIER_CACHE_DIR", str(tmp_path / "home"))
    assert default_profile_path() == tmp_path / "home" / "profile.json"


def test_stepped_prefill_sums_chunk_aligned_forwards():
    fit = PrefillFit(0.01, 1e-3, 2e-7, d=1e-6, e=3e-7)
    assert fit.stepped(0).seconds(300, 40) == fit.seconds(300, 40)
    step = fit.stepped(64)
    # 40 cached: forwards over [40, 64), [64, 128), ..., [320, 340)
    cuts = [40, 64, 128, 192, 256, 320, 340]
    want = sum(fit.seconds(b - a, a) for a, b in itertools.pairwise(cuts))
    assert step.seconds(300, 40) == pytest.approx(want, rel=1e-12)
    assert step.seconds(10, 64) == fit.seconds(10, 64)  # inside one chunk: one forward
    assert step.seconds(0, 64) == 0.0
    # each extra forward pays the fixed cost again
    assert step.seconds(640) > fit.seconds(640)
    with pytest.raises(ConfigError):
        fit.stepped(-1)
    assert PrefillFit(**{**step.__dict__}).step == 64  # a plain field: kept through JSON
