"""Typed tier URL options: one frozen dataclass per tier, parsed, checked and printed generically.

A tier declares its options as a frozen, keyword-only dataclass deriving :class:`UrlOptions`,
each field made with :func:`opt` (its kind, default, help and bounds), and an optional
:meth:`UrlOptions.check` for rules across fields. :func:`parse_options` reads a
:class:`~kvtier.tiers.base.TierURL` into an instance (an unknown option, a missing required one
or a bad value is a :class:`~kvtier.errors.ConfigError` one-liner), :func:`format_url` prints one
back (only the options that differ from their defaults, in declaration order, so parsing the
result gives the same instance), :func:`with_options` changes options of a URL (given its
options class) without editing its text, and :func:`describe` writes the usage line.

Kinds: ``size`` (bytes: ``8GiB``, ``1MiB``, ``4096``), ``int``, ``seconds`` (a finite number,
at least 0), ``switch`` (1/0, true/false, yes/no, on/off), ``tristate`` (a switch, or ``auto``
for None), ``choice`` (one of a fixed set, any case), ``str``, and ``directory``: not a query
option but the URL's path, an absolute directory (the host must be empty or ``localhost``). An
empty value (``name=``) stands for the option's default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import quote

from kvtier.codec.codecs import CODEC_NAMES
from kvtier.errors import ConfigError
from kvtier.policy.eviction import POLICIES
from kvtier.specs.units import GiB, KiB, MiB, TiB, parse_size
from kvtier.tiers.base import TierURL

Kind = Literal["size", "int", "seconds", "switch", "tristate", "choice", "str", "directory"]
KINDS: tuple[str, ...] = get_args(Kind)

#: The ``eviction=`` names (:data:`kvtier.policy.eviction.POLICIES`).
EVICTION_CHOICES: tuple[str, ...] = tuple(POLICIES)
#: The ``codec=`` names (:data:`kvtier.codec.CODEC_NAMES`).
CODEC_CHOICES: tuple[str, ...] = CODEC_NAMES
#: The disk tiers' ``io=`` backends.
IO_CHOICES: tuple[str, ...] = ("auto", "threads", "uring")

_META = "kvtier.option"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_PLACEHOLDER = {"size": "SIZE", "int": "N", "seconds": "SECONDS"}
_UNITS = ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"))


@dataclass(frozen=True)
class OptionSpec:
    """How one option is read, checked, printed and documented (kept in its field's metadata).

    ``arg``: the tier constructor's keyword when it is not the field's name; ``example``: a
    value shown in the usage line and in the error for a missing required option.
    """

    kind: Kind
    help: str = ""
    choices: tuple[str, ...] = ()
    min: int | float | None = None
    max: int | float | None = None
    arg: str | None = None
    example: str | None = None


def opt(
    kind: Kind,
    default: Any = MISSING,
    *,
    help: str = "",
    choices: tuple[str, ...] = (),
    min: int | float | None = None,
    max: int | float | None = None,
    arg: str | None = None,
    example: str | None = None,
) -> Any:
    """A dataclass field for a tier option; without ``default`` the option is required."""
    if kind not in KINDS:
        raise TypeError(f"unknown option kind {kind!r}; use one of {', '.join(KINDS)}")
    if (kind == "choice") != bool(choices):
        raise TypeError("choices go with kind 'choice', and it needs them")
    spec = OptionSpec(kind, help, tuple(c.lower() for c in choices), min, max, arg, example)
    if default is not MISSING and default is not None and not _valid(spec, default):
        raise TypeError(f"default {default!r} is not a valid {kind} option value")
    return field(default=default, metadata={_META: spec})


def size_text(n: int) -> str:
    """A byte count as a size option value: whole KiB, MiB, GiB or TiB when exact (``96MiB``)."""
    for unit, suffix in _UNITS:
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


@dataclass(frozen=True, kw_only=True)
class UrlOptions:
    """Base of the tiers' option dataclasses: checks every value on construction.

    Subclasses are ``@dataclass(frozen=True, kw_only=True)`` with fields made by :func:`opt`;
    they may override :meth:`check`. Construction (and ``dataclasses.replace``) raises
    ConfigError for a value outside its kind or bounds, so an instance is always usable.
    """

    def __post_init__(self) -> None:
        for f, spec in option_fields(type(self)):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            if not _valid(spec, value):
                raise ConfigError(f"option {f.name}={value!r}: {_allowed(spec)}")
        self.check()

    def check(self) -> None:
        """Rules across options (e.g. a slot no larger than the size); raise ConfigError."""

    def tier_kwargs(self) -> dict[str, Any]:
        """The tier constructor's arguments by keyword: ``cls(namespace, **o.tier_kwargs())``."""
        return {spec.arg or f.name: getattr(self, f.name) for f, spec in option_fields(type(self))}


OptionsT = TypeVar("OptionsT", bound=UrlOptions)


def parse_options(cls: type[OptionsT], url: TierURL | str) -> OptionsT:
    """The options a tier URL gives, defaults filled in, each value and ``check`` verified."""
    if isinstance(url, str):
        url = TierURL.parse(url)
    scheme = url.scheme
    specs = option_fields(cls)
    query = [(f, s) for f, s in specs if s.kind != "directory"]
    known = [f.name for f, _ in query]
    unknown = sorted(set(url.options) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown {scheme}:// tier option(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    values: dict[str, Any] = {}
    missing: list[str] = []
    for f, spec in specs:
        if spec.kind != "directory":
            continue
        if url.netloc not in ("", "localhost"):
            raise ConfigError(
                f"{scheme}:// tier URL names host {url.netloc!r}; use {scheme}:///abs/path"
            )
        if not url.path:
            missing.append("a directory")
        elif not url.path.startswith("/"):
            raise ConfigError(
                f"{scheme}:// tier URL needs an absolute directory, got {url.path!r}; "
                f"e.g. {example_url(cls, scheme)}"
            )
        else:
            values[f.name] = url.path
    for f, spec in query:
        text = url.options.get(f.name, "")
        if text == "":
            if f.default is MISSING:
                missing.append(f"?{f.name}=...")
            continue
        values[f.name] = _parse(scheme, f.name, spec, text)
    if missing:
        raise ConfigError(
            f"{scheme}:// tier URL needs {' and '.join(missing)}, e.g. {example_url(cls, scheme)}"
        )
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"{scheme}:// tier URL: {exc}") from None


def format_url(scheme: str, location: str | None, options: UrlOptions) -> str:
    """The URL of ``options``: the options that differ from their defaults, in declared order.

    ``location`` is what follows ``scheme://`` before the query; None takes it from the
    options' directory field where they have one (else empty, as for ``memory://``).
    """
    for f, spec in option_fields(type(options)):
        if spec.kind == "directory":
            own = getattr(options, f.name)
            if location is not None and location != own:
                raise ConfigError(
                    f"{scheme}:// URL location {location!r} differs from {f.name}={own!r}"
                )
            location = own
    location = location or ""
    if not _writable(location):
        raise ConfigError(
            f"{scheme}:// tier location {location!r} cannot be written in a URL "
            "('?' and '#' end the path; tabs and line breaks are dropped)"
        )
    parts = [
        f"{f.name}={_format(spec, getattr(options, f.name))}"
        for f, spec in option_fields(type(options))
        if spec.kind != "directory"
        and (f.default is MISSING or getattr(options, f.name) != f.default)
    ]
    url = f"{scheme}://{location}"
    return f"{url}?{'&'.join(parts)}" if parts else url


def with_options(url: str, cls: type[UrlOptions] | None, **changes: Any) -> str:
    """``url`` with some options changed, checked like a parsed URL (e.g. ``size=16 << 30``);
    ``cls`` is the options class of the URL's scheme (None: it declares none).

    A change is a typed value or text as in a URL (``size="16GiB"``; empty for the default).
    :func:`kvtier.tiers.registry.replace_options` finds ``cls`` by the scheme.
    """
    parsed = TierURL.parse(url)
    scheme = parsed.scheme
    if cls is None:
        raise ConfigError(f"the {scheme}:// tier declares no typed options to replace")
    current = parse_options(cls, parsed)
    specs = {f.name: (f, spec) for f, spec in option_fields(cls)}
    unknown = sorted(set(changes) - set(specs))
    if unknown:
        raise ConfigError(
            f"unknown {scheme}:// tier option(s) {', '.join(unknown)}; known: {', '.join(specs)}"
        )
    typed: dict[str, Any] = {}
    for name, value in changes.items():
        f, spec = specs[name]
        if isinstance(value, str) and spec.kind != "directory":
            if value == "":
                if f.default is MISSING:
                    raise ConfigError(f"{scheme}:// tier option {name} is required")
                value = f.default
            else:
                value = _parse(scheme, name, spec, value)
        typed[name] = value
    try:
        changed = dataclasses.replace(current, **typed)
    except ConfigError as exc:
        raise ConfigError(f"{scheme}:// tier URL: {exc}") from None
    has_directory = any(spec.kind == "directory" for _, spec in specs.values())
    return format_url(scheme, None if has_directory else parsed.netloc + parsed.path, changed)


def describe(cls: type[UrlOptions], *, verbose: bool = False) -> str:
    """The usage line of an options class: what follows ``scheme://``, required options first,
    optional ones in brackets with their default (``?size=8GiB[&eviction=lru|arc|cost]…``).

    ``verbose`` adds one line per option with its help.
    """
    location, required = _location_and_required(cls)
    optional = [
        f"{f.name}={_usage(f.name, spec, f.default)}"
        for f, spec in option_fields(cls)
        if spec.kind != "directory" and f.default is not MISSING
    ]
    line = location
    if required:
        line += "?" + "&".join(required) + "".join(f"[&{o}]" for o in optional)
    elif optional:
        line += f"[?{optional[0]}]" + "".join(f"[&{o}]" for o in optional[1:])
    if not verbose:
        return line
    rows = [line]
    for f, spec in option_fields(cls):
        if f.default is MISSING:
            default = "required"
        elif f.default is None:
            default = "default auto" if spec.kind == "tristate" else "default none"
        else:
            default = f"default {_format(spec, f.default)}"
        what = "the URL's path" if spec.kind == "directory" else spec.kind
        rows.append(f"  {f.name} ({what}, {default}): {spec.help}".rstrip(": "))
    return "\n".join(rows)


def example_url(cls: type[UrlOptions], scheme: str) -> str:
    """A URL with only the required parts of ``cls``, from their examples (for error messages)."""
    location, required = _location_and_required(cls)
    url = f"{scheme}://{location}"
    return f"{url}?{'&'.join(required)}" if required else url


def _location_and_required(cls: type[UrlOptions]) -> tuple[str, list[str]]:
    """The example location of ``cls``'s URLs and its required ``name=example`` options."""
    location = ""
    required: list[str] = []
    for f, spec in option_fields(cls):
        if spec.kind == "directory":
            location = spec.example or "/abs/dir"
        elif f.default is MISSING:
            required.append(f"{f.name}={spec.example or _placeholder(f.name, spec)}")
    return location, required


# --- kinds -------------------------------------------------------------------------------------
def option_fields(cls: type) -> list[tuple[dataclasses.Field, OptionSpec]]:
    """The (field, spec) pairs of an options class, in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_META)
        if spec is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with kvtier.tiers.url.opt")
        out.append((f, spec))
    return out


def _writable(location: str) -> bool:
    """Whether a URL's location reads back as written (urlsplit drops tabs and line breaks)."""
    return not any(c in location for c in "?#\t\r\n")


def _in_bounds(spec: OptionSpec, value: float) -> bool:
    return (spec.min is None or value >= spec.min) and (spec.max is None or value <= spec.max)


def _valid(spec: OptionSpec, value: Any) -> bool:
    kind = spec.kind
    if kind in ("size", "int"):
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (kind == "int" or value >= 0)
            and _in_bounds(spec, value)
        )
    if kind == "seconds":
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
            and _in_bounds(spec, value)
        )
    if kind == "switch":
        return isinstance(value, bool)
    if kind == "tristate":
        return value is None or isinstance(value, bool)
    if kind == "choice":
        return value in spec.choices
    if kind == "str":
        return isinstance(value, str) and value != ""
    return isinstance(value, str) and value.startswith("/") and _writable(value)  # directory


def _bounds(spec: OptionSpec) -> str:
    def show(x: float) -> str:
        return size_text(int(x)) if spec.kind == "size" else str(x)

    lo, hi = spec.min, spec.max
    if lo is not None and hi is not None:
        return f" from {show(lo)} to {show(hi)}"
    if lo is not None:
        return f" of at least {show(lo)}"
    if hi is not None:
        return f" of at most {show(hi)}"
    return ""


def _allowed(spec: OptionSpec) -> str:
    """What a valid value looks like, as the end of an error message."""
    kind = spec.kind
    if kind == "size":
        return f"use a size{_bounds(spec)} such as 512MiB, 8GiB or 4096"
    if kind == "int":
        return f"use an integer{_bounds(spec)}"
    if kind == "seconds":
        return f"use a finite number of seconds{_bounds(spec) or ' of at least 0'}"
    if kind == "switch":
        return "use 1 or 0 (true/false, yes/no, on/off)"
    if kind == "tristate":
        return "use 1, 0 or auto"
    if kind == "choice":
        return f"use one of {', '.join(spec.choices)}"
    if kind == "str":
        return "use non-empty text"
    return "use an absolute directory without '?', '#', tabs or line breaks"


def _parse(scheme: str, name: str, spec: OptionSpec, text: str) -> Any:
    """The value of option ``name`` written ``text`` (not empty), or a ConfigError naming both."""
    kind = spec.kind
    low = text.strip().lower()
    value: Any = None
    try:
        if kind == "size":
            value = parse_size(text)
        elif kind == "int":
            value = int(text)
        elif kind == "seconds":
            value = float(text)
        elif kind in ("switch", "tristate"):
            if low in _TRUE:
                value = True
            elif low in _FALSE:
                value = False
            elif kind == "tristate" and low == "auto":
                return None
        elif kind == "choice":
            value = low
        else:
            value = text
    except (ConfigError, ValueError):
        value = None
    if value is None or not _valid(spec, value):
        raise ConfigError(f"{scheme}:// tier option {name}={text!r}: {_allowed(spec)}")
    return value


def _format(spec: OptionSpec, value: Any) -> str:
    kind = spec.kind
    if kind == "size":
        return "" if value is None else size_text(value)
    if kind == "int":
        return "" if value is None else str(value)
    if kind == "seconds":
        return "" if value is None else repr(float(value))
    if kind in ("switch", "tristate"):
        return "auto" if value is None else ("1" if value else "0")
    if kind == "str":
        return "" if value is None else quote(value, safe="/:@")
    return str(value)


def _usage(name: str, spec: OptionSpec, default: Any) -> str:
    kind = spec.kind
    if kind == "switch":
        return "1|0" if default else "0|1"
    if kind == "tristate":
        first = _format(spec, default)
        return "|".join([first, *(v for v in ("auto", "1", "0") if v != first)])
    if kind == "choice":
        return "|".join([default, *(c for c in spec.choices if c != default)])
    if default is None:
        return spec.example or _placeholder(name, spec)
    return _format(spec, default)


def _placeholder(name: str, spec: OptionSpec) -> str:
    return _PLACEHOLDER.get(spec.kind, name.upper())


__all__ = [
    "CODEC_CHOICES",
    "EVICTION_CHOICES",
    "IO_CHOICES",
    "KINDS",
    "Kind",
    "OptionSpec",
    "UrlOptions",
    "describe",
    "example_url",
    "format_url",
    "opt",
    "option_fields",
    "parse_options",
    "size_text",
    "with_options",
]
