"""Arrival processes: seeded, starting at 0, at the asked mean rate; bursty means clustered."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.arrivals import bursty, poisson


def test_poisson_has_the_rate_and_exponential_gaps():
    t = poisson(4.0, 20000, seed=3)
    gaps = np.diff(t)
    assert len(t) == 20000 and t[0] == 0.0 and np.all(gaps >= 0)
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_bursty_keeps_the_rate_and_sets_the_spread_of_gaps(burstiness):
    gaps = np.diff(bursty(2.0, 20000, seed=1, burstiness=burstiness))
    assert 1 / gaps.mean() == pytest.approx(2.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness**-0.5, rel=0.08)


def test_seeded_same_seed_same_times_and_poisson_is_burstiness_one():
    assert np.array_equal(bursty(1.0, 50, seed=7), bursty(1.0, 50, seed=7))
    assert not np.array_equal(bursty(1.0, 50, seed=7), bursty(1.0, 50, seed=8))
    assert np.array_equal(poisson(1.0, 50, seed=7), bursty(1.0, 50, seed=7, burstiness=1.0))
    assert len(poisson(1.0, 0)) == 0 and list(poisson(1.0, 1)) == [0.0]


@pytest.mark.parametrize(
    ("rate", "n", "burstiness", "match"),
    [
        (0.0, 5, 1.0, "rate"),
        (float("inf"), 5, 1.0, "rate"),
        (1.0, -1, 1.0, "negative"),
        (1.0, 5, 0.0, "burstiness"),
    ],
)
def test_bad_parameters_are_config_errors(rate, n, burstiness, match):
    with pytest.raises(ConfigError, match=match):
        bursty(rate, n, burstiness=burstiness)
