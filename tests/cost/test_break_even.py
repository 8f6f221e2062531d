"""Break-even prefix length: smallest prefix whose reload beats recompute; its monotonicity."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cost import CostModel, RooflineCompute, TransferPath
from kvtier.errors import ConfigError
from kvtier.specs import get_gpu, get_link, get_model, get_storage

GB = 1e9
LLAMA8 = get_model("llama-3.1-8b")
COST = CostModel(RooflineCompute(LLAMA8, get_gpu("h100")), LLAMA8.kv_bytes_per_token())


def path(latency: float, bandwidth: float) -> TransferPath:
    return TransferPath("t", latency, read_bandwidth=bandwidth, device_bandwidth=55 * GB)


def test_break_even_is_the_smallest_winning_prefix():
    redis = TransferPath.from_specs(get_storage("redis"), get_link("pcie-gen5-x16"))
    n = COST.break_even_tokens(redis)
    assert n is not None and n > 1
    assert COST.reload_seconds(redis, n) < COST.recompute_seconds(n)
    assert COST.reload_seconds(redis, n - 1) >= COST.recompute_seconds(n - 1)


def test_longer_prefixes_favour_reload():
    for p in (path(20e-3, 5 * GB), path(200e-6, 2.5 * GB), path(1e-5, 55 * GB)):
        ratios = [COST.ratio(p, n) for n in (256, 1024, 4096, 16_384, 65_536, 131_072, 1 << 20)]
        assert ratios == sorted(ratios)
        assert ratios[0] < ratios[-1]


def test_faster_links_lower_the_break_even():
    bandwidths = [1 * GB, 2 * GB, 3 * GB, 7 * GB, 25 * GB, 55 * GB]
    evens = [COST.break_even_tokens(path(1e-3, bw)) for bw in bandwidths]
    assert all(e is not None for e in evens)
    assert evens == sorted(evens, reverse=True)
    assert evens[0] > evens[-1]


def test_more_latency_raises_the_break_even():
    evens = [COST.break_even_tokens(path(lat, 5 * GB)) for lat in (1e-5, 1e-3, 1e-2, 1e-1)]
    assert evens == sorted(evens) and evens[0] < evens[-1]


def test_none_when_reload_never_wins_within_the_range():
    glacial = path(3600.0, 1 * GB)
    assert COST.break_even_tokens(glacial, max_tokens=131_072) is None
    with pytest.raises(ConfigError):
        COST.break_even_tokens(glacial, max_tokens=0)


def test_compare_reports_both_times_and_their_ratio():
    p = path(1e-3, 7 * GB)
    rows = COST.compare(p, [1024, 8192])
    assert [r.tokens for r in rows] == [1024, 8192]
    for r in rows:
        assert r.ratio == pytest.approx(r.recompute_s / r.reload_s)
        assert r.ratio == pytest.approx(COST.ratio(p, r.tokens))


@settings(max_examples=60, deadline=None)
@given(
    latency=st.floats(0, 0.5),
    bw=st.floats(0.1 * GB, 100 * GB),
    faster=st.floats(1.0, 20.0),
)
def test_break_even_monotone_in_bandwidth(latency, bw, faster):
    slow = COST.break_even_tokens(path(latency, bw))
    fast = COST.break_even_tokens(path(latency, bw * faster))
    if slow is not None:
        assert fast is not None and fast <= slow


def test_kv_bytes_must_be_positive():
    with pytest.raises(ConfigError):
        CostModel(COST.compute, 0)
