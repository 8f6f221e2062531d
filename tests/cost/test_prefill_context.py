"""Prefill fits with context terms: cached tokens cost at their own rate, and once per forward."""

from __future__ import annotations

import pytest

from kvtier.cost.calibration import CalibrationProfile, PrefillFit, fit_prefill

TRUE = PrefillFit(a=0.003, b=1.2e-2, c=1e-7, d=3e-5, e=8e-7)
GRID = [(n, 0) for n in (16, 64, 256, 512, 2048)] + [
    (n, p) for n in (16, 64) for p in (512, 2048, 8192)
]


def test_context_fit_recovers_exact_parameters():
    fit = fit_prefill([(n, p, TRUE.seconds(n, p)) for n, p in GRID], context_terms=True)
    got = (fit.a, fit.b, fit.c, fit.d, fit.e)
    assert got == pytest.approx((TRUE.a, TRUE.b, TRUE.c, TRUE.d, TRUE.e), rel=1e-6)
    assert fit.max_rel_error < 1e-9


def test_without_context_terms_the_old_form_holds():
    old = PrefillFit(a=0.01, b=1e-3, c=2e-7)
    assert old.seconds(100, 50) == pytest.approx(0.01 + 0.1 + 2e-7 * 100 * (50 + 50))
    assert old.seconds(0, 10) == 0.0
    # the old form cannot follow a per-forward cost of the cached KV; the context form can
    samples = [(n, p, TRUE.seconds(n, p)) for n, p in GRID]
    assert fit_prefill(samples).max_rel_error > 0.05


def test_context_terms_survive_the_profile_json(tmp_path):
    from kvtier.cost.calibration import ProfileModel

    model = ProfileModel("m", "f", "bf16", 2, 1, 8, 64, 16)
    profile = CalibrationProfile(model=model, prefill=TRUE)
    back = CalibrationProfile.load(profile.save(tmp_path / "p.json"))
    assert back.prefill.seconds(32, 8192) == pytest.approx(TRUE.seconds(32, 8192))
    legacy = profile.to_dict()
    del legacy["prefill"]["d"], legacy["prefill"]["e"]  # a profile written before them
    old = CalibrationProfile.from_dict(legacy).prefill
    assert (old.d, old.e) == (0.0, None)
