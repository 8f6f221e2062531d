"""What ``--json`` prints must be strict JSON: infinities and NaNs (an unlimited tier, a ratio
over nothing) become ``null``; a report's fields that keep an object's own names are read off
it by name."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every non-finite float inside its dicts, lists and tuples replaced by None
    (tuples become lists, as JSON has them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def attrs(obj: object, *names: str) -> dict[str, Any]:
    """``obj``'s attributes ``names``, each under its own name, in the order given: the part of
    a JSON report that says what an object holds without renaming it."""
    return {name: getattr(obj, name) for name in names}


__all__ = ["attrs", "finite"]
