"""Parsing of concurrency ranges, runtime reserve and shared-tier options."""

import pytest

from kvtier.errors import ConfigError
from kvtier.plan import parse_concurrency, parse_reserve, parse_shared


@pytest.mark.parametrize(
    ("text", "values", "is_range"),
    [
        ("8", (8,), False),
        ("16,1,4", (1, 4, 16), False),
        ("1:64", (1, 2, 4, 8, 16, 32, 64), True),
        ("3:100", (3, 4, 8, 16, 32, 64, 100), True),
        ("1:20:8", (1, 9, 17, 20), True),
        ("5:5", (5,), True),
    ],
)
def test_concurrency_forms(text, values, is_range):
    assert parse_concurrency(text) == (values, is_range)


@pytest.mark.parametrize("text", ["0", "64:1", "a:b", "1:2:3:4", "", "1.5", "-3", "1:64:0", "1,,2"])
def test_bad_concurrency(text):
    with pytest.raises(ConfigError):
        parse_concurrency(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10%", (0.10, 0.0)), ("0.2", (0.2, 0.0)), ("0", (0.0, 0.0)), ("8GiB", (0.0, 8 * 2**30))],
)
def test_reserve_forms(text, expected):
    fraction, size = parse_reserve(text)
    assert fraction == pytest.approx(expected[0]) and size == expected[1]


@pytest.mark.parametrize("text", ["100%", "-5%", "3", "lots", "1.5"])
def test_bad_reserve(text):
    with pytest.raises(ConfigError):
        parse_reserve(text)


def test_shared_tier_option():
    assert parse_shared("none") is None and parse_shared("") is None
    assert parse_shared("redis") == ("redis", None)
    assert parse_shared("net-100g:10TB") == ("net-100g", 10e12)
    with pytest.raises(ConfigError):
        parse_shared(":1TB")
    with pytest.raises(ConfigError):
        parse_shared("redis:lots")
