"""Bailian traces: sessions from the parent chain, turns and kinds, seconds, 16-token blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.traces import read_trace

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "bailian_handwritten.jsonl"


def test_sessions_turns_kinds_and_arrivals():
    trace = read_trace(FIXTURE, "bailian")
    assert trace.skipped == 0
    got = [(r.arrival_s, r.session, r.turn, r.kind) for r in trace.requests]
    assert got == [
        (0.0, "1", 1, "text"),
        (0.5, "2", 1, "search"),
        (2.0, "2", 2, "search"),  # listed after chat 3 but earlier: sorted by arrival
        (4.25, "1", 2, "text"),
        (5.0, "4", 1, "image"),  # no parent_chat_id: its own session
        (10.0, "1", 3, "text"),  # parent 3, whose parent is 1
        (11.0, "99", 4, "file"),  # parent outside the file names the session
    ]
    assert all(r.block_tokens == 16 and r.after_s is None for r in trace.requests)


def test_turns_share_their_common_prefix_blocks_only():
    r = {(x.session, x.turn): x for x in read_trace(FIXTURE, "bailian").requests}
    first, second, third = r["1", 1], r["1", 2], r["1", 3]
    assert len(first.blocks) == 3 and len(third.blocks) == 7  # 100 tokens: last block partial
    assert second.blocks[:2] == first.blocks[:2] and second.blocks[2] != first.blocks[2]
    assert third.blocks[:4] == second.blocks[:4] and third.blocks[4] != second.blocks[4]
    assert r["2", 1].blocks[0] == first.blocks[0]  # the shared first block
    assert r["2", 1].blocks[1] != first.blocks[1]


def test_missing_turn_is_the_depth_in_the_chain(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(
        '{"chat_id": 5, "timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
        '{"chat_id": 6, "parent_chat_id": 5, "timestamp": 2, "input_length": 20, '
        '"output_length": 1, "hash_ids": [1, 2]}\n'
    )
    assert [(r.session, r.turn, r.kind) for r in read_trace(path, "bailian").requests] == [
        ("5", 0, ""),
        ("5", 1, ""),
    ]


def test_a_looping_parent_chain_and_a_repeated_chat_id_are_errors(tmp_path):
    base = '"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": []'
    path = tmp_path / "loop.jsonl"
    path.write_text(
        f'{{"chat_id": 1, "parent_chat_id": 2, {base}}}\n'
        f'{{"chat_id": 2, "parent_chat_id": 1, {base}}}\n'
    )
    with pytest.raises(ConfigError, match=r"loop.jsonl:1: the parent chain of chat 1 loops"):
        read_trace(path, "bailian")
    path.write_text(f'{{"chat_id": 1, {base}}}\n{{"chat_id": 1, {base}}}\n')
    with pytest.raises(ConfigError, match=r":2: chat_id 1 appears again \(first on line 1\)"):
        read_trace(path, "bailian")
    trace = read_trace(path, "bailian", skip_bad=True)
    assert (len(trace.requests), trace.skipped) == (1, 1)
