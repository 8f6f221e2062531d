"""Token-level requests without tokens: what a simulator replays or generates.

A :class:`TraceRequest` says when a request arrives, how long its prompt and answer are, and
which prefix blocks its prompt shares with others: ``blocks`` holds one chained key per
``block_tokens``-token block of the prompt (the last block may be partial), so two requests whose
``blocks`` agree up to position ``i`` share their first ``i + 1`` blocks of tokens. Keys are
16-byte xxh3-128 digests chained over the ids a trace gives (:func:`chain_keys`), so they do
not depend on ``PYTHONHASHSEED`` and two traces' ids never collide by accident.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from kvtier.errors import ConfigError

#: The key of "no prefix yet": the chain starts from it.
ROOT = b"\x00" * 16


def chain_keys(ids: Iterable[object], namespace: bytes = b"") -> tuple[bytes, ...]:
    """Chained 16-byte keys of a prompt's block ids: key i = xxh3_128(key i-1 ‖ id i).

    ``ids`` are whatever a trace names a block with (ints, hex strings); ``namespace`` keeps
    the ids of different traces apart.
    """
    return extend_keys(xxhash.xxh3_128_digest(namespace) if namespace else ROOT, ids)


def extend_keys(prev: bytes, ids: Iterable[object]) -> tuple[bytes, ...]:
    """The chained keys of ``ids`` after the key ``prev``, as :func:`chain_keys` chains them:
    a prompt that grows by some blocks gets its new keys without hashing its prefix again.
    """
    out: list[bytes] = []
    digest = xxhash.xxh3_128_digest
    for item in ids:
        prev = digest(prev + str(item).encode())
        out.append(prev)
    return tuple(out)


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload (see the module docs).

    ``arrival_s``: when it arrives, from the start of the workload. ``session``/``turn``: the
    conversation it belongs to and its place there (``None``: a one-shot request). ``after_s``:
    for a closed-loop replay, seconds after the previous turn of its session finished that it
    is sent (``None``: open loop, at ``arrival_s``). ``measured``: what a real run measured for
    it (``ttft_s``, ``e2e_s``, …), for a comparison; empty for traces that have none.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[bytes, ...]
    block_tokens: int
    session: str | None = None
    turn: int = 0
    kind: str = ""
    after_s: float | None = None
    measured: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.input_tokens < 1:
            raise ConfigError(f"a request needs at least one prompt token, got {self.input_tokens}")
        if self.output_tokens < 0:
            raise ConfigError(f"output tokens must not be negative, got {self.output_tokens}")
        if self.block_tokens < 1:
            raise ConfigError(f"block_tokens must be at least 1, got {self.block_tokens}")
        if self.arrival_s < 0:
            raise ConfigError(f"arrival time must not be negative, got {self.arrival_s}")
        if len(self.blocks) > -(-self.input_tokens // self.block_tokens):
            raise ConfigError(
                f"{len(self.blocks)} blocks of {self.block_tokens} tokens are more than a "
                f"{self.input_tokens}-token prompt has"
            )


__all__ = ["ROOT", "TraceRequest", "chain_keys", "extend_keys"]
