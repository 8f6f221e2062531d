"""A slice of a Mooncake-format request trace for ``kvtier bench serve``, scaled to the model.

A Mooncake trace line holds a request's arrival (``timestamp``, ms), its ``input_length`` and
``output_length`` and the ids of its prompt's hash blocks (``hash_ids``, 512 tokens each): two
requests that share leading ids share that prefix. vLLM's own ``timed_trace`` dataset replays
such a file: it draws each id's tokens from Python's ``hash()`` of the id (the client runs with
``PYTHONHASHSEED`` pinned) and sends each request at its time. A slice here keeps the trace's
prefix structure and arrival times and scales it to a small model on a small machine: each
hash block becomes ``block_tokens`` tokens, a prompt is cut to the engine's context, answers to
``max_output`` tokens, and times are multiplied by ``time_scale``. Each run of the slice gets
ids of its own (an offset per seed), so no run finds another run's prefixes in any cache.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError

#: Tokens per hash block in the Mooncake traces.
TRACE_BLOCK_TOKENS = 512
#: The embedded model's context: a slice's prompts and answers fit in it.
TRACE_MODEL_LEN = 8192
#: How far apart the ids of two runs' slices are (beyond any id the traces use).
SEED_ID_STRIDE = 1 << 32


@dataclass(frozen=True)
class TraceRequest:
    """One request of a slice, scaled: its time (s), prompt and answer lengths, block ids."""

    at_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class TraceSlice:
    """``requests`` lines of a trace from ``start``, scaled (see the module's docstring)."""

    path: Path
    start: int
    block_tokens: int
    time_scale: float
    items: tuple[TraceRequest, ...]

    @classmethod
    def read(
        cls,
        path: Path,
        *,
        requests: int,
        start: int = 0,
        block_tokens: int = 64,
        time_scale: float = 1.0,
        max_input: int = 7680,
        max_output: int = 16,
    ) -> TraceSlice:
        """The slice of ``path``; a file that is missing or not a trace is a ConfigError."""
        if requests < 1 or start < 0 or block_tokens < 16 or block_tokens % 16:
            raise ConfigError(
                "--trace-requests must be ≥ 1, --trace-start ≥ 0 and --trace-block-tokens a "
                f"multiple of 16; got {requests}, {start}, {block_tokens}"
            )
        if not time_scale > 0 or not math.isfinite(time_scale):
            raise ConfigError(f"--trace-time-scale must be positive, got {time_scale}")
        try:
            with path.open() as f:
                lines = [line for i, line in enumerate(f) if start <= i < start + requests]
        except OSError as exc:
            raise ConfigError(f"--trace {path}: {exc.strerror or exc}") from None
        if len(lines) < requests:
            raise ConfigError(
                f"--trace {path} has {start + len(lines)} lines; --trace-start {start} and "
                f"--trace-requests {requests} need {start + requests}"
            )
        keep = max_input // block_tokens
        try:
            rows = [json.loads(line) for line in lines]
            first = float(rows[0]["timestamp"])
            items = tuple(
                TraceRequest(
                    (float(r["timestamp"]) - first) / 1000 * time_scale,
                    max(
                        block_tokens,
                        min(
                            keep * block_tokens,
                            -(-int(r["input_length"]) * block_tokens // TRACE_BLOCK_TOKENS),
                        ),
                    ),
                    max(1, min(max_output, int(r["output_length"]))),
                    tuple(int(h) for h in r["hash_ids"][:keep]),
                )
                for r in rows
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"--trace {path}: not a Mooncake trace (timestamp, input_length, output_length, "
                f"hash_ids on each line): {exc}"
            ) from None
        return cls(path, start, block_tokens, time_scale, items)

    @property
    def requests(self) -> int:
        return len(self.items)

    @property
    def longest(self) -> int:
        """Tokens of the longest request with its answer."""
        return max(r.input_tokens + r.output_tokens for r in self.items)

    @property
    def tokens(self) -> int:
        """Every prompt's and answer's tokens together."""
        return sum(r.input_tokens + r.output_tokens for r in self.items)

    @property
    def distinct_tokens(self) -> int:
        """Tokens of the distinct hash blocks: what a cache holding everything would hold."""
        ids = {h for r in self.items for h in r.hash_ids}
        return len(ids) * self.block_tokens

    @property
    def reused_share(self) -> float:
        """The share of prompt blocks an earlier request of the slice already had."""
        seen: set[int] = set()
        reused = total = 0
        for r in self.items:
            reused += sum(1 for h in r.hash_ids if h in seen)
            total += len(r.hash_ids)
            seen.update(r.hash_ids)
        return reused / total if total else 0.0

    @property
    def median_input(self) -> int:
        lengths = sorted(r.input_tokens for r in self.items)
        return lengths[len(lengths) // 2]

    def write(self, path: Path, seed: int) -> Path:
        """The slice as a ``timed_trace`` file (ms times), its ids offset for ``seed``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        offset = seed * SEED_ID_STRIDE
        with path.open("w") as f:
            for r in self.items:
                row = {
                    "timestamp": round(r.at_s * 1000, 3),
                    "input_length": r.input_tokens,
                    "output_length": r.output_tokens,
                    "hash_ids": [h + offset for h in r.hash_ids],
                }
                f.write(json.dumps(row) + "\n")
        return path

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "start": self.start,
            "requests": self.requests,
            "block_tokens": self.block_tokens,
            "time_scale": self.time_scale,
            "longest": self.longest,
            "median_input": self.median_input,
            "distinct_tokens": self.distinct_tokens,
            "reused_share": self.reused_share,
            "span_s": self.items[-1].at_s,
        }

    def shape(self) -> str:
        """One line: what the slice is."""
        return (
            f"trace: {self.requests} requests of {self.path.name} from line {self.start}, "
            f"{self.block_tokens} tokens a hash block, prompts {self.median_input} tokens "
            f"(median), {self.reused_share:.0%} of blocks reused, over "
            f"{self.items[-1].at_s:.0f} s; "
        )


def timed_trace_args(dataset_file: Path, block_tokens: int) -> tuple[str, ...]:
    """vLLM's ``timed_trace`` dataset over a slice's file (times in ms, sent at their time)."""
    return (
        "--dataset-name",
        "timed_trace",
        "--dataset-path",
        str(dataset_file),
        "--timed-trace-chunk-hash-size",
        str(block_tokens),
        "--timed-trace-sec-multiplier",
        "0.001",
    )


__all__ = ["TRACE_MODEL_LEN", "TraceRequest", "TraceSlice", "timed_trace_args"]
