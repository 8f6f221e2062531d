"""Alibaba Bailian's trace format (the Qwen serving traces): one JSON object per line.

``chat_id``, ``parent_chat_id`` (the previous turn's ``chat_id``; -1 or absent for a first
turn), ``timestamp`` (arrival, seconds by default), ``input_length``, ``output_length``,
``type`` (the request's kind: text, search, image, file, …), ``turn`` and ``hash_ids`` (one id
per ``block_tokens``-token block, 16 by default, the last block possibly partial).

A request's session is the root of its parent chain: follow ``parent_chat_id`` up to a first
turn (or to a parent the file does not hold, whose id then names the session). ``turn`` is taken
as given; where it is absent, the request's depth in the chain (0 for a first turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.workloads.requests import TraceRequest, chain_keys
from kvtier.workloads.traces.lines import (
    BadLine,
    TraceUnits,
    hash_ids,
    integer,
    number,
    read_lines,
    rebased,
)

#: Bailian's own units: 16-token blocks, timestamps in seconds.
UNITS = TraceUnits(block_tokens=16, time_unit_s=1.0, namespace=b"bailian")


@dataclass(frozen=True)
class _Chat:
    line: int
    chat_id: int
    parent: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    kind: str
    turn: int | None
    blocks: tuple[bytes, ...]


def read_bailian(
    path: str | Path, units: TraceUnits = UNITS, *, skip_bad: bool = False
) -> tuple[list[TraceRequest], int]:
    """The requests of a Bailian trace (sorted by arrival, from its first timestamp) with their
    sessions, turns and kinds, and the count of bad lines skipped; block keys are
    ``chain_keys(hash_ids, units.namespace)``.
    """
    seen: dict[int, int] = {}

    def parse(record: dict[str, Any], line: int) -> _Chat:
        chat_id = integer(record, "chat_id")
        parent = record.get("parent_chat_id", -1)
        if type(parent) is not int or parent < -1:
            raise BadLine(f"field 'parent_chat_id' must be an integer >= -1, got {parent!r}")
        if parent == chat_id:
            raise BadLine(f"chat {chat_id} names itself as its parent")
        if chat_id in seen:
            raise BadLine(f"chat_id {chat_id} appears again (first on line {seen[chat_id]})")
        arrival = number(record, "timestamp") * units.time_unit_s
        n_in = integer(record, "input_length", low=1)
        n_out = integer(record, "output_length")
        kind = record.get("type", "")
        if type(kind) is not str:
            raise BadLine(f"field 'type' must be a string, got {kind!r}")
        turn = integer(record, "turn") if "turn" in record else None
        ids = hash_ids(record, n_in, units.block_tokens)
        seen[chat_id] = line
        blocks = chain_keys(ids, units.namespace)
        return _Chat(line, chat_id, parent, arrival, n_in, n_out, kind, turn, blocks)

    chats, skipped = read_lines(path, parse, skip_bad=skip_bad)
    by_id = {c.chat_id: c for c in chats}
    roots: dict[int, tuple[int, int]] = {}  # chat id -> (root id, depth)

    def root(chat: _Chat) -> tuple[int, int]:
        chain = []
        c: _Chat | None = chat
        while c is not None and c.chat_id not in roots:
            if c.chat_id in chain:
                raise ConfigError(
                    f"{path}:{chat.line}: the parent chain of chat {chat.chat_id} loops"
                )
            chain.append(c.chat_id)
            if c.parent == -1:
                roots[c.chat_id] = (c.chat_id, 0)
                chain.pop()
                break
            c = by_id.get(c.parent)
            if c is None:  # a parent outside the file names the session
                missing = by_id[chain[-1]].parent
                roots[chain.pop()] = (missing, 1)
                break
        for chat_id in reversed(chain):
            parent_root, depth = roots[by_id[chat_id].parent]
            roots[chat_id] = (parent_root, depth + 1)
        return roots[chat.chat_id]

    requests = []
    for c in chats:
        session, depth = root(c)
        turn = depth if c.turn is None else c.turn
        requests.append(
            TraceRequest(
                c.arrival_s,
                c.input_tokens,
                c.output_tokens,
                c.blocks,
                units.block_tokens,
                session=str(session),
                turn=turn,
                kind=c.kind,
            )
        )
    return rebased(requests), skipped


__all__ = ["UNITS", "read_bailian"]
