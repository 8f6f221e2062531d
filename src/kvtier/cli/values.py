"""Command-line values turned into what a command runs on: comma lists and configs.

Every refusal is a :class:`~kvtier.errors.ConfigError` with the caller's own one-line
message, so each command keeps naming its option the way its users know it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

from kvtier.errors import ConfigError

T = TypeVar("T")


def name_list(text: str) -> tuple[str, ...]:
    """The comma-separated items of ``text``, spaces and empty items dropped: ``"a, b,"``
    → ``("a", "b")``."""
    return tuple(x for x in text.replace(" ", "").split(",") if x)


def int_list(text: str, unreadable: str, empty: str | None = None) -> tuple[int, ...]:
    """The comma-separated integers of ``text`` (``"1, 4,16"`` → ``(1, 4, 16)``).

    Raises ConfigError(``unreadable``) when an item is not an integer, and ConfigError(``empty``)
    when there is none (with ``empty`` None, an empty list is returned as it is).
    """
    try:
        values = tuple(int(x) for x in name_list(text))
    except ValueError:
        raise ConfigError(unreadable) from None
    if not values and empty is not None:
        raise ConfigError(empty)
    return values


def byte_size(text: str, option: str) -> float:
    """A size such as ``256GB`` or ``8GiB`` in bytes; ConfigError naming ``option`` when it
    cannot be read."""
    from kvtier.specs.units import parse_size

    try:
        return float(parse_size(text))
    except ConfigError as exc:
        raise ConfigError(f"{option}: {exc}") from None


def config_from(cls: type[T], options: Mapping[str, Any], **given: Any) -> T:
    """A ``cls`` dataclass from a command's option values named like its fields, ``given``
    (fields named otherwise on the command line, or values converted) winning over them.

    Options that are no field of ``cls`` are left out; fields that no option names keep their
    defaults.
    """
    names = {f.name for f in fields(cls) if f.init}  # type: ignore[arg-type]
    picked = {name: value for name, value in options.items() if name in names}
    return cls(**(picked | given))


__all__ = ["byte_size", "config_from", "int_list", "name_list"]
