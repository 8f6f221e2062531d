"""Comma lists and configs built from a command's option values."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvtier.cli.values import byte_size, config_from, int_list, name_list
from kvtier.errors import ConfigError


def test_name_list_drops_spaces_and_empty_items():
    assert name_list(" vllm, kvtier ,,example,") == ("vllm", "kvtier", "example")
    assert name_list("") == ()


def test_int_list_reads_integers_and_says_the_callers_message():
    assert int_list("1, 4,16", "unreadable") == (1, 4, 16)
    with pytest.raises(ConfigError) as unreadable:
        int_list("a,2", "--depth: cannot read 'a,2'")
    assert str(unreadable.value) == "--depth: cannot read 'a,2'"
    with pytest.raises(ConfigError) as empty:
        int_list(" , ", "unreadable", "nothing given")
    assert str(empty.value) == "nothing given"
    assert int_list("", "unreadable") == ()  # no message for an empty list: it is returned


def test_byte_size_reads_units_and_names_the_option():
    assert byte_size("256GB", "--dram") == 256e9
    assert byte_size("8GiB", "--dram") == 8 * 2**30
    with pytest.raises(ConfigError) as bad:
        byte_size("lots", "--nvme")
    assert str(bad.value).startswith("--nvme: ")


@dataclass(frozen=True)
class _Config:
    model: str = "m"
    chunk_tokens: int = 64
    tiers: tuple[str, ...] = ()
    seen: list[str] = field(default_factory=list, init=False)


def test_config_from_takes_the_options_named_like_fields_and_given_values_win():
    options = {"model": "tiny", "chunk_tokens": 256, "json_out": True, "tier": ["memory://"]}
    config = config_from(_Config, options, tiers=("memory://",), chunk_tokens=128)
    assert config == _Config(model="tiny", chunk_tokens=128, tiers=("memory://",))


def test_config_from_keeps_defaults_of_fields_no_option_names():
    assert config_from(_Config, {"json_out": False}) == _Config()
