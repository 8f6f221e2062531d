"""Parsing of the planner's textual inputs: concurrency ranges, runtime reserve, tier options."""

from __future__ import annotations

import re

from kvtier.errors import ConfigError
from kvtier.specs.units import parse_size

_INT = re.compile(r"^\s*\d+\s*$")


def _positive_int(text: str, what: str) -> int:
    if not _INT.match(text):
        raise ConfigError(f"{what}: {text!r} is not a whole number")
    value = int(text)
    if value < 1:
        raise ConfigError(f"{what} must be at least 1, got {value}")
    return value


def parse_concurrency(text: str) -> tuple[tuple[int, ...], bool]:
    """Concurrency values and whether they form a range.

    ``8`` is one value, ``1,4,16`` a list, ``1:64`` the powers of two from 1 to 64 (both ends
    included), ``1:64:8`` every 8th value from 1, plus 64. The planner adds the exact overflow
    points to a range.
    """
    what = "concurrency"
    text = str(text).strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ConfigError(f"{what}: write N, A,B,C, A:B or A:B:STEP, not {text!r}")
        lo, hi = (_positive_int(p, what) for p in parts[:2])
        if lo > hi:
            raise ConfigError(f"{what}: range {text!r} starts above its end")
        if len(parts) == 3:
            values = set(range(lo, hi + 1, _positive_int(parts[2], f"{what} step")))
        else:
            values, power = {lo}, 1
            while power <= hi:
                if power > lo:
                    values.add(power)
                power *= 2
        values.add(hi)
        return tuple(sorted(values)), True
    values = {_positive_int(p, what) for p in text.split(",")}
    return tuple(sorted(values)), False


def parse_reserve(text: str) -> tuple[float, float]:
    """(fraction of HBM, bytes) from ``10%``, ``0.1`` or a size such as ``8GiB``."""
    raw = str(text).strip()
    hint = "give the runtime reserve as a percentage (10%), a fraction (0.1) or a size (8GiB)"
    try:
        if raw.endswith("%"):
            fraction = float(raw[:-1]) / 100
        elif re.fullmatch(r"\d*\.?\d+", raw):
            fraction = float(raw)
            if fraction >= 1:
                raise ConfigError(f"reserve {raw!r} is ambiguous; {hint}")
        else:
            return 0.0, float(parse_size(raw))
    except ValueError:
        raise ConfigError(f"cannot read reserve {raw!r}; {hint}") from None
    if not 0 <= fraction < 1:
        raise ConfigError(f"reserve {raw!r} must be at least 0 % and below 100 % of HBM")
    return fraction, 0.0


def parse_shared(text: str) -> tuple[str, float | None] | None:
    """``NAME[:SIZE]`` of a shared tier (SIZE absent: unlimited), or None for ``none``/empty."""
    raw = str(text).strip()
    if raw.lower() in ("", "none", "off", "0"):
        return None
    name, _, size = raw.partition(":")
    if not name:
        raise ConfigError(f"shared tier {raw!r}: write NAME or NAME:SIZE, e.g. redis:1TB")
    return name, (float(parse_size(size)) if size else None)
