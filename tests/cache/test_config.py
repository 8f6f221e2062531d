"""CacheConfig catches impossible set-ups with a message that says what to change."""

from __future__ import annotations

import pytest

from kvtier.cache import CacheConfig, TierOptions
from kvtier.errors import ConfigError


def test_write_modes_can_be_given_as_strings():
    config = CacheConfig(tiers=("through", "back", "none"))
    assert config.tiers == (TierOptions("through"), TierOptions("back"), TierOptions("none"))
    assert CacheConfig().with_tiers("through", "back").tiers[1].write == "back"


def test_default_is_write_through_everywhere():
    assert CacheConfig().options_for(3) == (TierOptions(),) * 3


@pytest.mark.parametrize(
    ("tiers", "n", "match"),
    [
        (("through",), 2, "one per tier"),
        (("back", "through"), 2, "fastest tier cannot be write-back"),
        (("through", "none", "back"), 3, "never written"),
    ],
)
def test_impossible_tier_set_ups_are_refused(tiers, n, match):
    with pytest.raises(ConfigError, match=match):
        CacheConfig(tiers=tiers).options_for(n)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"queue_chunks": 0},
        {"chunk_tokens": 0},
        {"lease_ttl_s": 0},
        {"lease_ttl_s": 700, "max_lease_s": 600},
        {"block_bytes": 0},
        {"error_backoff_s": -1},
        {"latency_buckets": (1.0, 0.1)},
    ],
)
def test_bad_numbers_are_refused(kwargs):
    with pytest.raises(ConfigError):
        CacheConfig(**kwargs)


def test_unknown_write_mode_is_refused():
    with pytest.raises(ConfigError, match="write mode"):
        TierOptions(write="sometimes")
