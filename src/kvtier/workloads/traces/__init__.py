"""Trace replay: request traces read into :class:`~kvtier.workloads.requests.TraceRequest` lists.

Formats: Mooncake's JSONL (``mooncake``, the default), Alibaba Bailian's JSONL (``bailian``) and
the per-request records of a ``kvtier run --json`` report (``kvtier-run``). Each takes its block
size and time unit as parameters, with the format's own defaults. A malformed line is a
one-line :class:`~kvtier.errors.ConfigError` naming the file and line, or, with ``skip_bad``,
skipped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.workloads.requests import TraceRequest
from kvtier.workloads.traces import bailian, mooncake
from kvtier.workloads.traces.kvtier_run import RunMeta, read_kvtier_run

FORMATS = ("mooncake", "bailian", "kvtier-run")
#: The JSONL formats: reader and own units (block tokens, seconds per time unit, namespace).
_JSONL = {
    "mooncake": (mooncake.read_mooncake, mooncake.UNITS),
    "bailian": (bailian.read_bailian, bailian.UNITS),
}


@dataclass(frozen=True)
class Trace:
    """A trace read from a file: its requests (sorted by arrival), the bad lines skipped, and,
    for a ``kvtier-run`` report, the run's set-up (:class:`RunMeta`)."""

    requests: list[TraceRequest]
    skipped: int = 0
    run: RunMeta | None = None


def read_trace(
    path: str | Path,
    fmt: str = "mooncake",
    *,
    block_tokens: int | None = None,
    time_unit_s: float | None = None,
    skip_bad: bool = False,
    namespace: bytes | None = None,
    system: str | None = None,
) -> Trace:
    """Read the trace at ``path`` in format ``fmt`` (one of :data:`FORMATS`).

    ``block_tokens`` / ``time_unit_s``: tokens per trace block and seconds per time unit (the
    format's defaults when ``None``: Mooncake 512 and ms, Bailian 16 and s, a run report its
    chunk size and s). ``namespace`` keeps the block ids of different traces apart (default:
    the format's name). ``system``: which phase of a run report (default: the first).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown trace format '{fmt}'; use one of {', '.join(FORMATS)}")
    if block_tokens is not None and block_tokens < 1:
        raise ConfigError(f"block_tokens must be at least 1, got {block_tokens}")
    if time_unit_s is not None and not time_unit_s > 0:
        raise ConfigError(f"time_unit_s must be positive, got {time_unit_s}")
    if fmt == "kvtier-run":
        if namespace is not None:
            raise ConfigError("a kvtier-run report carries its own keys; it takes no namespace")
        requests, skipped, meta = read_kvtier_run(
            path,
            system=system,
            block_tokens=block_tokens,
            time_unit_s=1.0 if time_unit_s is None else time_unit_s,
            skip_bad=skip_bad,
        )
        return Trace(requests, skipped, meta)
    if system is not None:
        raise ConfigError(f"system names a phase of a kvtier-run report, not of a {fmt} trace")
    read, units = _JSONL[fmt]
    units = units.given(block_tokens, time_unit_s, namespace)
    requests, skipped = read(path, units, skip_bad=skip_bad)
    return Trace(requests, skipped)


__all__ = ["FORMATS", "RunMeta", "Trace", "read_trace"]
