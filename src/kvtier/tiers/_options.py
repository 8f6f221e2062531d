"""Parsing of tier URL options shared by the tiers (integers and 1/0/auto switches)."""

from __future__ import annotations

from kvtier.errors import ConfigError


def int_opt(opts: dict[str, str], name: str, default: int) -> int:
    """The integer option ``name`` (``default`` when absent or empty)."""
    text = opts.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"tier option {name}={text!r} is not an integer") from None


def tristate(text: str, name: str) -> bool | None:
    """A 1/0/auto switch: True, False, or None for auto."""
    low = text.strip().lower()
    if low in ("", "auto"):
        return None
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"tier option {name}={text!r}: use 1, 0 or auto")


__all__ = ["int_opt", "tristate"]
