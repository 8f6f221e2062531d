"""Mooncake's trace format (kvcache-ai/Mooncake, FAST'25): one JSON object per line.

``timestamp`` (arrival, milliseconds by default), ``input_length`` and ``output_length``
(tokens), ``hash_ids`` (one id per ``block_tokens``-token block of the prompt, 512 by default,
the last block possibly partial; equal ids at equal positions are a shared prefix). Requests are
one-shot (no session): the trace keeps multi-turn reuse in its ids, not in names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.workloads.requests import TraceRequest, chain_keys
from kvtier.workloads.traces.lines import TraceUnits, hash_ids, integer, number, read_lines, rebased

#: Mooncake's own units: 512-token blocks, timestamps in milliseconds.
UNITS = TraceUnits(block_tokens=512, time_unit_s=1e-3, namespace=b"mooncake")


def read_mooncake(
    path: str | Path, units: TraceUnits = UNITS, *, skip_bad: bool = False
) -> tuple[list[TraceRequest], int]:
    """The requests of a Mooncake trace (sorted by arrival, from its first timestamp) and the
    count of bad lines skipped (always 0 unless ``skip_bad``); block keys are
    ``chain_keys(hash_ids, units.namespace)``.
    """

    def parse(record: dict[str, Any], _line: int) -> TraceRequest:
        arrival = number(record, "timestamp") * units.time_unit_s
        n_in = integer(record, "input_length", low=1)
        n_out = integer(record, "output_length")
        ids = hash_ids(record, n_in, units.block_tokens)
        keys = chain_keys(ids, units.namespace)
        return TraceRequest(arrival, n_in, n_out, keys, units.block_tokens)

    requests, skipped = read_lines(path, parse, skip_bad=skip_bad)
    return rebased(requests), skipped


__all__ = ["UNITS", "read_mooncake"]
