"""The refined prefill model: robust to disturbed calibration points, learns from the run."""

from __future__ import annotations

import pytest

from kvtier.cost.calibration import PrefillFit
from kvtier.cost.online import RefinedCompute, robust_prefill_fit

TRUE = PrefillFit(a=0.002, b=1.3e-2, c=1e-7, d=3e-5, e=8e-7)
POINTS = [
    (16, 0),
    (32, 0),
    (64, 0),
    (128, 0),
    (256, 0),
    (512, 0),
    (16, 256),
    (64, 256),
    (64, 512),
    (16, 1024),
    (64, 1024),
]


def _samples(points, disturbed=()):
    return [(n, p, TRUE.seconds(n, p) * (4.0 if (n, p) in disturbed else 1.0)) for n, p in points]


def test_robust_fit_drops_a_disturbed_point():
    samples = _samples(POINTS, disturbed={(32, 0)})
    fit = robust_prefill_fit(samples)
    assert fit.max_rel_error < 1e-6
    assert fit.seconds(2048, 0) == pytest.approx(TRUE.seconds(2048, 0), rel=1e-4)
    assert len(fit.samples) == len(samples) - 1


def test_refined_compute_learns_from_observed_prefills():
    # a calibration caught in contention: every short point 4x too slow
    bad = _samples(POINTS[:4], disturbed=set(POINTS[:4]))
    base = PrefillFit(0.0, 0.05, 0.0, samples=tuple(bad))
    compute = RefinedCompute(base)
    assert compute.prefill_seconds(300) > 2 * TRUE.seconds(300)
    for n, p in [
        (226, 0),
        (98, 128),
        (300, 0),
        (150, 192),
        (400, 0),
        (60, 256),
        (250, 0),
        (120, 320),
        (350, 0),
        (90, 256),
        (200, 0),
        (64, 384),
    ]:
        compute.observe(n, p, TRUE.seconds(n, p))
    assert compute.observed == 12
    assert compute.prefill_seconds(320, 0) == pytest.approx(TRUE.seconds(320, 0), rel=0.1)
    assert compute.prefill_seconds(64, 256) == pytest.approx(TRUE.seconds(64, 256), rel=0.1)
    compute.observe(0, 10, 1.0)  # nothing new: ignored
    assert compute.observed == 12


def test_refined_compute_predicts_exact_mode_as_the_sum_of_its_forwards():
    base = PrefillFit(0.0, 0.05, 0.0, samples=tuple(_samples(POINTS)))
    plain, stepped = RefinedCompute(base), RefinedCompute(base, step=64)
    assert stepped.prefill_seconds(300, 40) == pytest.approx(
        plain.fit.stepped(64).seconds(300, 40), rel=1e-12
    )
    assert stepped.prefill_seconds(300, 40) > plain.prefill_seconds(300, 40)  # 6 forwards, not 1
    stepped.observe(64, 128, TRUE.seconds(64, 128))  # one forward of exact mode
    assert stepped.fit.step == 64 and stepped.observed == 1
