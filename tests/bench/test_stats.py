"""Summaries shared by the benchmarks: the bootstrap interval of a ratio of medians."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.bench.stats import median_ratio_interval, pearson_r


def test_the_interval_holds_the_ratio_and_narrows_with_more_rounds():
    rng = np.random.default_rng(3)
    few = median_ratio_interval(rng.normal(95, 8, 5), rng.normal(100, 8, 5))
    many = median_ratio_interval(rng.normal(95, 8, 200), rng.normal(100, 8, 200))
    assert few is not None and many is not None
    assert few[0] < 0.95 < few[1] and many[0] < 0.95 < many[1]
    assert many[1] - many[0] < (few[1] - few[0]) / 3


def test_same_rounds_same_interval_and_too_few_rounds_none():
    a, b = [98.0, 99.0, 80.0], [100.0, 90.0, 110.0]
    assert median_ratio_interval(a, b) == median_ratio_interval(a, b)
    assert median_ratio_interval([1.0], [1.0, 2.0]) is None
    assert median_ratio_interval([1.0, 2.0], [0.0, 1.0]) is None
    assert median_ratio_interval([5.0, 5.0], [5.0, 5.0]) == (1.0, 1.0)


def test_pearson_r_follows_paired_samples_and_needs_spread_on_both_sides():
    assert pearson_r([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert pearson_r([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert abs(pearson_r([1, 2, 3, 4], [1, -1, -1, 1])) < 1e-12
    assert pearson_r([5, 5, 5], [1, 2, 3]) is None
    assert pearson_r([1, 2, 3], [7, 7, 7]) is None


def test_paired_requests_see_a_gain_their_spread_hides_unpaired():
    rng = np.random.default_rng(5)
    alone = rng.lognormal(0.0, 1.0, 32)  # requests of very different sizes
    faster = alone * 0.85  # every request 15 % faster
    unpaired = median_ratio_interval(faster, alone, statistic=np.mean)
    paired = median_ratio_interval(faster, alone, statistic=np.mean, paired=True)
    assert unpaired is not None and paired is not None
    assert unpaired[1] >= 1.0 > paired[1] and paired[0] == pytest.approx(0.85)
    with pytest.raises(ValueError, match="differ in size"):
        median_ratio_interval([1.0, 2.0], [1.0, 2.0, 3.0], paired=True)
