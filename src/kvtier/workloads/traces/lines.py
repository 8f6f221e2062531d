"""Reading a JSONL trace line by line: a bad line is a one-line error naming file and line, or,
when the caller asks, skipped and counted.

Each format's reader turns one decoded line into a request (or raises :class:`BadLine`);
:func:`read_lines` does the rest: opening, decoding, numbering, skipping.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from kvtier.errors import ConfigError
from kvtier.workloads.requests import TraceRequest

T = TypeVar("T")


class BadLine(ValueError):
    """One record of a trace cannot be read; the message says why (without file or line)."""


@dataclass(frozen=True)
class TraceUnits:
    """How a JSONL trace counts: tokens per ``hash_ids`` block, seconds per ``timestamp`` unit,
    and the namespace its block keys are chained under (it keeps traces' equal ids apart)."""

    block_tokens: int
    time_unit_s: float
    namespace: bytes

    def given(
        self,
        block_tokens: int | None = None,
        time_unit_s: float | None = None,
        namespace: bytes | None = None,
    ) -> TraceUnits:
        """These units with each value that is given (not None) in place of its default."""
        return TraceUnits(
            self.block_tokens if block_tokens is None else block_tokens,
            self.time_unit_s if time_unit_s is None else time_unit_s,
            self.namespace if namespace is None else namespace,
        )


def open_text(path: str | Path) -> Iterator[str]:
    """The lines of a trace file; a missing or unreadable file is a :class:`ConfigError`."""
    p = Path(path)
    if not p.is_file():
        what = "is not a file" if p.exists() else "does not exist"
        raise ConfigError(f"trace file {p} {what}; give the path of a trace file")
    try:
        with p.open("r", encoding="utf-8") as f:
            yield from f
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read trace file {p}: {e}") from None


def read_lines(
    path: str | Path, parse: Callable[[dict[str, Any], int], T], *, skip_bad: bool = False
) -> tuple[list[T], int]:
    """``parse(record, line_number)`` for every JSON object line of ``path``, and how many bad
    lines were skipped.

    Blank lines are ignored. A line that is not a JSON object, or that ``parse`` rejects, raises
    a :class:`ConfigError` naming ``path`` and the line number, unless ``skip_bad``.
    """
    out: list[T] = []
    skipped = 0
    loads = json.loads
    for line_number, line in enumerate(open_text(path), start=1):
        if not line.strip():
            continue
        try:
            try:
                record = loads(line)
            except ValueError as e:
                raise BadLine(f"not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise BadLine(f"a line must be a JSON object, got {type(record).__name__}")
            out.append(parse(record, line_number))
        except (BadLine, ConfigError) as e:
            if not skip_bad:
                raise ConfigError(
                    f"{path}:{line_number}: {e} (skip_bad skips such lines)"
                ) from None
            skipped += 1
    return out, skipped


def number(record: dict[str, Any], name: str, *, low: float = 0.0) -> float:
    """Field ``name`` of ``record`` as a number of at least ``low``."""
    value = record.get(name)
    if type(value) not in (int, float) or not math.isfinite(value):
        raise BadLine(f"field '{name}' must be a number, got {_shown(value)}")
    if value < low:
        raise BadLine(f"field '{name}' must be >= {low:g}, got {value}")
    return float(value)


def integer(record: dict[str, Any], name: str, *, low: int = 0) -> int:
    """Field ``name`` of ``record`` as an integer of at least ``low``."""
    value = record.get(name)
    if type(value) is not int:
        raise BadLine(f"field '{name}' must be an integer, got {_shown(value)}")
    if value < low:
        raise BadLine(f"field '{name}' must be >= {low}, got {value}")
    return value


def hash_ids(record: dict[str, Any], input_tokens: int, block_tokens: int) -> list[Any]:
    """The ``hash_ids`` list of ``record``: integers, no more than the prompt's blocks."""
    ids = record.get("hash_ids")
    if type(ids) is not list:
        raise BadLine(f"field 'hash_ids' must be a list of integers, got {_shown(ids)}")
    if not all(type(i) is int for i in ids):
        raise BadLine("field 'hash_ids' must hold integers only")
    if len(ids) > -(-input_tokens // block_tokens):
        raise BadLine(
            f"{len(ids)} hash ids of {block_tokens}-token blocks are more than "
            f"input_length {input_tokens} allows"
        )
    return ids


def _shown(value: object) -> str:
    if value is None:
        return "nothing (missing)"
    text = json.dumps(value) if isinstance(value, (str, list, dict, bool)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def rebased(requests: list[TraceRequest]) -> list[TraceRequest]:
    """``requests`` sorted by arrival (stable), their times counted from the earliest one."""
    if not requests:
        return []
    start = min(r.arrival_s for r in requests)
    if start:
        requests = [replace(r, arrival_s=r.arrival_s - start) for r in requests]
    return sorted(requests, key=lambda r: r.arrival_s)
