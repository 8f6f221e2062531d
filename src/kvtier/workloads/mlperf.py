"""MLPerf Storage's KV-cache benchmark I/O traces (``kv-cache.py --io-trace-log trace.csv``).

Each row is one operation the benchmark would have done on a whole request's KV:
``Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase`` (``Write`` in the prefill, ``Read``
1 + ⌈generated/32⌉ times in the decode). A ``.zst`` trace is read through zstandard when it is
installed. A malformed row is a one-line error naming the file and line.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import ConfigError

HEADER = ("Timestamp", "Operation", "Object_Size_Bytes", "Tier", "Key", "Phase")
_OPS = {"write": "write", "read": "read"}


@dataclass(frozen=True)
class TraceOp:
    """One traced operation: when, read or write, the object's bytes, its tier, key and phase."""

    timestamp: float
    op: str  # "read" or "write"
    size: int
    tier: str
    key: str
    phase: str


def _lines(path: Path) -> Iterator[str]:
    if path.suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise ConfigError(f"{path}: a .zst trace needs `pip install zstandard`") from None
        with path.open("rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw)
            yield from io.TextIOWrapper(reader, encoding="utf-8", newline="")
        return
    with path.open(newline="", encoding="utf-8") as f:
        yield from f


def read_trace(path: str | Path) -> list[TraceOp]:
    """Every operation of an MLPerf KV-cache trace, in file order."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no trace file {path}; make one with kv-cache.py --io-trace-log")
    rows = csv.reader(_lines(path))
    header = next(rows, None)
    if header is None or tuple(h.strip() for h in header) != HEADER:
        raise ConfigError(f"{path}: not an MLPerf KV-cache trace (header {header!r})")
    ops: list[TraceOp] = []
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        try:
            stamp, op, size, tier, key, phase = row
            kind = _OPS[op.strip().lower()]
            nbytes = int(size)
            if nbytes < 0 or not key:
                raise ValueError
            ops.append(TraceOp(float(stamp), kind, nbytes, tier, key, phase))
        except (ValueError, KeyError):
            raise ConfigError(f"{path}:{line}: not a trace row: {','.join(row)[:120]}") from None
    return ops


__all__ = ["HEADER", "TraceOp", "read_trace"]
