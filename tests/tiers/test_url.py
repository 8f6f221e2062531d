"""Typed tier URL options: every kind's good and bad values, cross-field checks, round trips of
format_url/parse_options, defaults equal to the tier constructors', and the usage line."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import MISSING

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.policy.eviction import POLICIES
from kvtier.specs import GiB, KiB, MiB
from kvtier.tiers.base import TierURL
from kvtier.tiers.files.options import FileTierOptions, PerBlockOptions, SlabOptions
from kvtier.tiers.memory.options import MemoryOptions
from kvtier.tiers.registry import replace_options
from kvtier.tiers.url import (
    IO_CHOICES,
    UrlOptions,
    describe,
    example_url,
    format_url,
    opt,
    option_fields,
    parse_options,
    size_text,
)

SCHEMES = {MemoryOptions: "memory", PerBlockOptions: "file", SlabOptions: "slab"}


def _refused(cls, url: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_options(cls, url)
    message = str(info.value)
    assert "\n" not in message  # one line
    return message


# --- kinds -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [("8GiB", 8 * GiB), ("1MiB", MiB), ("4096", 4096), ("260KiB", 260 * KiB), ("1.5GiB", 3 << 29)],
)
def test_size_values(text, value):
    assert parse_options(MemoryOptions, f"memory://?size={text}").size == value


@pytest.mark.parametrize("text", ["8XB", "-1", "0", "lots", "1e3"])
def test_bad_size_names_option_value_and_form(text):
    message = _refused(MemoryOptions, f"memory://?size={text}")
    assert f"size={text!r}" in message and "such as 512MiB" in message


def test_int_values_and_bounds():
    assert parse_options(PerBlockOptions, "file:///d?size=1GiB&depth=32").depth == 32
    assert parse_options(PerBlockOptions, "file:///d?size=1GiB&admit_after=3").admit_after == 3
    for text in ("0", "-2", "1.5", "eight"):
        message = _refused(PerBlockOptions, f"file:///d?size=1GiB&depth={text}")
        assert f"depth={text!r}" in message and "integer of at least 1" in message
    assert "admit_after='0'" in _refused(SlabOptions, "slab:///d?size=1GiB&admit_after=0")


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("0.5", 0.5), ("2", 2.0), ("1e-3", 1e-3)])
def test_seconds_values(text, value):
    assert parse_options(SlabOptions, f"slab:///d?size=1GiB&rescan={text}").rescan == value


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "1e400", "-1", "-0.1", "soon"])
def test_seconds_refuse_nan_inf_negative(text):
    message = _refused(SlabOptions, f"slab:///d?size=1GiB&rescan={text}")
    assert f"rescan={text!r}" in message and "finite number of seconds" in message


@pytest.mark.parametrize(
    ("text", "value"),
    [(t, True) for t in ("1", "true", "yes", "on", "TRUE", "On")]
    + [(t, False) for t in ("0", "false", "no", "off", "No")],
)
def test_switch_values(text, value):
    got = parse_options(PerBlockOptions, f"file:///d?size=1GiB&sync={text}&dirsync={text}")
    assert got.sync is value and got.dirsync is value


@pytest.mark.parametrize("text", ["maybe", "auto", "2", "y"])
def test_bad_switch(text):
    message = _refused(PerBlockOptions, f"file:///d?size=1GiB&recycle={text}")
    assert f"recycle={text!r}" in message and "use 1 or 0" in message


@pytest.mark.parametrize(
    ("text", "value"), [("auto", None), ("AUTO", None), ("1", True), ("0", False)]
)
def test_tristate_values(text, value):
    got = parse_options(MemoryOptions, f"memory://?size=1MiB&pin={text}&native={text}")
    assert got.pin is value and got.native is value
    assert parse_options(SlabOptions, f"slab:///d?size=1GiB&direct={text}").direct is value


def test_bad_tristate():
    assert "use 1, 0 or auto" in _refused(MemoryOptions, "memory://?size=1MiB&pin=maybe")


def test_choice_values():
    for name in POLICIES:
        got = parse_options(MemoryOptions, f"memory://?size=1MiB&eviction={name.upper()}")
        assert got.eviction == name
    for io in ("auto", "threads", "uring"):
        assert parse_options(SlabOptions, f"slab:///d?size=1GiB&io={io}").io == io


def test_bad_choice_lists_the_allowed():
    message = _refused(MemoryOptions, "memory://?size=1MiB&eviction=fifo")
    assert "eviction='fifo'" in message and "lru, arc, cost" in message
    assert "auto, threads, uring" in _refused(PerBlockOptions, "file:///d?size=1GiB&io=aio")


def test_io_choices_are_the_backends():
    from kvtier.tiers.io.backends import BACKENDS

    assert set(IO_CHOICES) == {"auto", *BACKENDS}


def test_str_values_and_empty_is_default():
    assert parse_options(MemoryOptions, "memory://?size=1MiB&name=").name is None
    got = parse_options(MemoryOptions, "memory://?size=1MiB&name=my%20dram&slot=&gil_copy_max=")
    assert got.name == "my dram" and got.slot is None and got.gil_copy_max == 256 * KiB
    assert parse_options(SlabOptions, "slab:///d?size=1GiB&depth=&rescan=").depth == 8


# --- structure ---------------------------------------------------------------------------------
def test_unknown_option_lists_the_known_ones():
    message = _refused(MemoryOptions, "memory://?size=1MiB&sz=1&colour=red")
    assert message.startswith("unknown memory:// tier option(s) colour, sz; known: size, ")
    message = _refused(SlabOptions, "slab:///d?size=1GiB&dirsync=1")  # a file:// option
    assert "dirsync" in message and "rescan" in message and "directory" not in message


def test_missing_size_gives_an_example():
    message = _refused(MemoryOptions, "memory://?eviction=arc")
    assert message == "memory:// tier URL needs ?size=..., e.g. memory://?size=8GiB"
    assert "e.g. file:///nvme/kv?size=200GiB" in _refused(PerBlockOptions, "file:///d")
    assert "size=" in _refused(SlabOptions, "slab:///d?size=")


def test_directory_rules():
    message = _refused(PerBlockOptions, "file://?size=1GiB")
    assert "needs a directory" in message and "e.g. file:///nvme/kv?size=200GiB" in message
    assert "names host 'nas'" in _refused(SlabOptions, "slab://nas/kv?size=1GiB")
    assert "absolute directory" in _refused(PerBlockOptions, "file:kv?size=1GiB")
    got = parse_options(SlabOptions, "slab://localhost/nvme/kv?size=1GiB")
    assert got.directory == "/nvme/kv"
    with pytest.raises(ConfigError, match="absolute directory"):
        SlabOptions(directory="kv", size=1)


def test_memory_ignores_host_and_path_as_before():
    assert parse_options(MemoryOptions, "memory:///?size=1MiB").size == MiB


def test_slot_larger_than_size():
    message = _refused(MemoryOptions, "memory://?size=1MiB&slot=2MiB")
    assert "slot=2MiB larger than size=1MiB: every put would fail" in message
    assert "larger than size" in _refused(SlabOptions, "slab:///d?size=256KiB&slot=260KiB")
    assert parse_options(MemoryOptions, "memory://?size=1MiB&slot=1MiB").slot == MiB
    assert parse_options(SlabOptions, "slab:///d?size=1MiB&slot=0").slot == 0
    assert "slot='0'" in _refused(MemoryOptions, "memory://?size=1MiB&slot=0")


@pytest.mark.parametrize("cls,scheme", [(SlabOptions, "slab"), (PerBlockOptions, "file")])
def test_staging_no_host_could_give_is_refused_when_the_url_is_given(cls, scheme):
    from kvtier.tiers.io.buffers import host_memory

    beyond = (host_memory() // GiB + 1) * GiB
    message = _refused(cls, f"{scheme}:///d?size=1GiB&staging={beyond // GiB}GiB")
    assert f"staging={beyond // GiB}GiB is more than this host's RAM" in message
    assert parse_options(cls, f"{scheme}:///d?size=1GiB&staging=64MiB").staging == 64 * MiB


def test_construction_checks_values():
    with pytest.raises(ConfigError, match="gil_copy_max=-1"):
        MemoryOptions(size=MiB, gil_copy_max=-1)
    with pytest.raises(ConfigError, match="staging=-1"):
        PerBlockOptions(directory="/d", size=GiB, staging=-1)
    with pytest.raises(ConfigError, match="size=0"):
        MemoryOptions(size=0)
    with pytest.raises(ConfigError, match="rescan=nan"):
        SlabOptions(directory="/d", size=GiB, rescan=float("nan"))
    with pytest.raises(ConfigError, match="sync=1"):
        SlabOptions(directory="/d", size=GiB, sync=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="every put would fail"):
        dataclasses.replace(MemoryOptions(size=MiB), slot=2 * MiB)


def test_options_are_frozen():
    got = MemoryOptions(size=MiB)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.size = 2  # type: ignore[misc]


def test_a_field_needs_opt():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Bad(UrlOptions):
        size: int = 1

    with pytest.raises(TypeError, match="opt"):
        Bad()
    with pytest.raises(TypeError):
        opt("colour", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        opt("int", "eight")


# --- format, round trips -----------------------------------------------------------------------
def test_format_prints_only_non_defaults_in_order():
    assert format_url("memory", None, MemoryOptions(size=8 * GiB)) == "memory://?size=8GiB"
    got = MemoryOptions(size=8 * GiB, name="dram", eviction="arc", pin=False)
    assert format_url("memory", None, got) == "memory://?size=8GiB&eviction=arc&pin=0&name=dram"
    slab = SlabOptions(directory="/nvme/kv", size=GiB, slot=260 * KiB, sync=False)
    assert format_url("slab", None, slab) == "slab:///nvme/kv?size=1GiB&sync=0&slot=260KiB"
    assert format_url("slab", "/nvme/kv", slab) == format_url("slab", None, slab)
    with pytest.raises(ConfigError, match="differs"):
        format_url("slab", "/elsewhere", slab)
    with pytest.raises(ConfigError, match="cannot be written"):
        format_url("mytier", "/a?b", MemoryOptions(size=1))


def test_size_text():
    assert [size_text(n) for n in (0, 1, 4096, 96 << 20, 3 << 29, 2 << 40)] == [
        "0",
        "1",
        "4KiB",
        "96MiB",
        "1536MiB",
        "2TiB",
    ]


@pytest.mark.parametrize(
    "url",
    [
        "memory://?size=8GiB",
        "memory://?size=8GiB&eviction=cost&slot=1MiB&pin=1&gil_copy_max=0&native=0&name=dram",
        "file:///nvme/kv?size=200GiB&depth=8",
        "file:///nvme/kv?size=200GiB&admit_after=2&io=threads&staging=0&direct=1&dirsync=1",
        "slab:///abs/dir?size=1GiB&slot=260KiB",
        "slab:///a b/dir%20x?size=1&rescan=0.25&name=a%26b%3Dc+d",
    ],
)
def test_explicit_round_trips(url):
    parsed = TierURL.parse(url)
    cls = next(c for c, s in SCHEMES.items() if s == parsed.scheme)
    got = parse_options(cls, parsed)
    text = format_url(parsed.scheme, None, got)
    assert parse_options(cls, text) == got
    assert format_url(parsed.scheme, None, parse_options(cls, text)) == text


_DIR_CHARS = st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="/?#")
_DIRECTORY = st.lists(st.text(_DIR_CHARS, min_size=1, max_size=8), min_size=1, max_size=4).map(
    lambda parts: "/" + "/".join(parts)
)


def _sizes(lo: int) -> st.SearchStrategy[int]:
    plain = st.integers(lo, 1 << 50)
    return st.one_of(
        plain,
        *(st.integers(max(lo, 1), 1 << 20).map(lambda n, u=u: n * u) for u in (KiB, MiB, GiB)),
    )


def _values(field: dataclasses.Field, spec) -> st.SearchStrategy:
    kind = spec.kind
    if kind == "size":
        base = _sizes(int(spec.min or 0))
    elif kind == "int":
        base = st.integers(int(spec.min if spec.min is not None else -(10**6)), 10**6)
    elif kind == "seconds":
        base = st.floats(0, 1e9, allow_nan=False, allow_infinity=False)
    elif kind in ("switch", "tristate"):
        base = st.booleans()
    elif kind == "choice":
        base = st.sampled_from(spec.choices)
    elif kind == "str":
        base = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)
    else:
        return _DIRECTORY
    if field.default is None:
        return st.one_of(st.none(), base)
    if field.default is not MISSING:
        return st.one_of(st.just(field.default), base)
    return base


@st.composite
def _options(draw, cls):
    values = {f.name: draw(_values(f, spec)) for f, spec in option_fields(cls)}
    try:
        return cls(**values)
    except ConfigError:  # e.g. a slot larger than the size
        assume(False)


@pytest.mark.parametrize("cls", list(SCHEMES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_round_trip(cls, data):
    options = data.draw(_options(cls))
    url = format_url(SCHEMES[cls], None, options)
    assert parse_options(cls, url) == options
    assert parse_options(cls, TierURL.parse(url)) == options


# --- replace_options (the registry's, over with_options) ----------------------------------------
def test_replace_options():
    assert replace_options("memory://?size=8MiB&name=dram", size=100 << 20) == (
        "memory://?size=100MiB&name=dram"
    )
    assert replace_options("file:///d?size=1GiB&depth=4", depth="16", name="") == (
        "file:///d?size=1GiB&depth=16"
    )
    assert (
        replace_options("slab://localhost/d?size=1GiB", sync=False) == "slab:///d?size=1GiB&sync=0"
    )
    assert replace_options("file:///d?size=1GiB&depth=4", depth="") == "file:///d?size=1GiB"


def test_replace_options_validates_the_result():
    with pytest.raises(ConfigError, match="every put would fail"):
        replace_options("memory://?size=8MiB&slot=1MiB", size=512 * KiB)
    with pytest.raises(ConfigError, match="depth='0'"):
        replace_options("file:///d?size=1GiB", depth="0")
    with pytest.raises(ConfigError, match="depth=0"):
        replace_options("file:///d?size=1GiB", depth=0)
    with pytest.raises(ConfigError, match="unknown file:// tier option"):
        replace_options("file:///d?size=1GiB", colour="red")
    with pytest.raises(ConfigError, match="unknown slab:// tier option"):
        replace_options("slab:///d?size=1GiB&colour=red", depth=2)
    with pytest.raises(ConfigError, match="unknown redis:// tier option"):
        replace_options("redis://host:6379/0?size=1GiB", size=2 * GiB)
    assert replace_options("redis://host:6379/0", ttl=60) == "redis://host:6379/0?ttl=60.0"


# --- defaults equal the tiers' -----------------------------------------------------------------
def _tiers():
    from kvtier.tiers.files.per_block import DiskTier
    from kvtier.tiers.files.slab import SlabTier
    from kvtier.tiers.memory.tier import MemoryTier

    return [(MemoryOptions, MemoryTier), (PerBlockOptions, DiskTier), (SlabOptions, SlabTier)]


def _constructor_params(tier: type) -> dict[str, inspect.Parameter]:
    """A tier's constructor parameters, with those it hands on to its bases (``**common``)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in reversed(tier.__mro__):
        if "__init__" in vars(klass) and klass is not object:
            for name, param in inspect.signature(vars(klass)["__init__"]).parameters.items():
                if param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                    params[name] = param
    return params


@pytest.mark.parametrize("pair", range(3))
def test_defaults_equal_the_tier_constructors(pair):
    cls, tier = _tiers()[pair]
    params = _constructor_params(tier)
    params.pop("self"), params.pop("namespace")
    kwargs_of_defaults = {}
    for f, spec in option_fields(cls):
        param = params.pop(spec.arg or f.name)
        if f.default is MISSING:
            assert param.default is inspect.Parameter.empty, f.name
        else:
            assert param.default == f.default, f.name
            kwargs_of_defaults[spec.arg or f.name] = f.default
    assert set(params) <= {"rescan_full", "device_io"}  # constructor arguments no URL sets
    required = {f.name: spec.example for f, spec in option_fields(cls) if f.default is MISSING}
    options = parse_options(cls, example_url(cls, SCHEMES[cls]))
    assert {
        k: v for k, v in options.tier_kwargs().items() if k not in ("capacity", "directory")
    } == (kwargs_of_defaults)
    assert set(required) <= {"size", "directory"}


def test_tier_kwargs_renames():
    got = MemoryOptions(size=MiB, slot=64 * KiB).tier_kwargs()
    assert got["capacity"] == MiB and got["slot_size"] == 64 * KiB and "size" not in got
    got = SlabOptions(directory="/d", size=GiB, slot=8 * KiB).tier_kwargs()
    assert got["directory"] == "/d" and got["capacity"] == GiB and got["slot"] == 8 * KiB
    assert issubclass(PerBlockOptions, FileTierOptions) and issubclass(SlabOptions, FileTierOptions)


def test_common_file_options_are_shared():
    common = [f.name for f, _ in option_fields(FileTierOptions)]
    assert common == [
        "directory",
        "size",
        "eviction",
        "admit_after",
        "io",
        "depth",
        "staging",
        "direct",
        "sync",
        "name",
        "codec",
    ]
    per_block = [*common, "dirsync", "recycle", "gds"]
    assert [f.name for f, _ in option_fields(PerBlockOptions)] == per_block
    assert [f.name for f, _ in option_fields(SlabOptions)] == [*common, "slot", "rescan"]


# --- describe ----------------------------------------------------------------------------------
def test_describe():
    line = describe(MemoryOptions)
    assert line.startswith("?size=8GiB[&eviction=lru|arc|cost")
    assert "[&slot=1MiB]" in line and "[&pin=auto|1|0]" in line and "[&gil_copy_max=256KiB]" in line
    assert line.endswith("[&name=NAME][&codec=raw|zstd|kv]") and "\n" not in line
    line = describe(SlabOptions)
    assert line.startswith("/nvme/kv?size=200GiB[&")
    assert "[&io=auto|threads|uring]" in line and "[&sync=1|0]" in line
    assert "[&rescan=0.05]" in line and "[&depth=8]" in line
    assert "[&dirsync=0|1]" in describe(PerBlockOptions)
    long = describe(PerBlockOptions, verbose=True).splitlines()
    assert long[0] == describe(PerBlockOptions)
    assert len(long) == 1 + len(option_fields(PerBlockOptions))
    assert any(row.startswith("  depth (int, default 8): ") for row in long)


def test_describe_without_required_options():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Few(UrlOptions):
        depth: int = opt("int", 4, min=1)
        fast: bool = opt("switch", False)

    assert describe(Few) == "[?depth=4][&fast=0|1]"
    assert example_url(Few, "few") == "few://"
    assert parse_options(Few, "few://") == Few()
    assert format_url("few", None, Few(fast=True)) == "few://?fast=1"
