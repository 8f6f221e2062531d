"""What the reports of both jobs share: their JSON document, the statistics their summaries take,
and the seconds their tables print.

The engine-specific modules (:mod:`kvtier.job.hf_report`, :mod:`kvtier.job.vllm_report`) hold
the records each job measures and the figures derived from them; the pieces that make a JSON
document or a table cell out of those figures live here, so both reports write them alike.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def attribute_dict(obj: object, names: Iterable[str]) -> dict[str, Any]:
    """``{name: obj.name}`` for each of ``names``, in their order: the part of a record's JSON
    that is its fields (or properties) as they are."""
    return {name: getattr(obj, name) for name in names}


def jsonable(value: Any) -> Any:
    """What ``json.dumps`` writes for a value it cannot: tuples and sets as lists, the rest as
    its ``str``."""
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)


def report_json(document: dict[str, Any]) -> str:
    """A report's JSON document as the ``--json`` output writes it (indented, see
    :func:`jsonable`)."""
    return json.dumps(document, indent=2, default=jsonable)


def median(values: Sequence[float]) -> float | None:
    """The median of ``values``; None when empty."""
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100, linear interpolation) of ``values``; None when empty."""
    return float(np.percentile(values, q)) if values else None


def format_seconds(x: float | None, ms_digits: int = 1) -> str:
    """Seconds as a table prints them: milliseconds with ``ms_digits`` decimals below a second,
    else seconds with two; ``–`` for None."""
    if x is None:
        return "–"
    return f"{x * 1e3:.{ms_digits}f} ms" if abs(x) < 1 else f"{x:.2f} s"


__all__ = [
    "attribute_dict",
    "format_seconds",
    "jsonable",
    "median",
    "percentile",
    "report_json",
]
