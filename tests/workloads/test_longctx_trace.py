"""The long-context workload as trace requests: the same requests dry_run plays, with block keys
that are equal exactly where the token prefixes are."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.longctx import LongContextSpec, build_sessions, dry_run, scaled
from kvtier.workloads.longctx_trace import longctx_requests, token_block_keys

SPEC = scaled(LongContextSpec(), 0.0)


def test_the_requests_of_dry_run_with_sessions_turns_kinds_and_lengths():
    steps = dry_run(build_sessions(SPEC))
    requests = longctx_requests(SPEC, block_tokens=128)
    assert len(requests) == SPEC.requests() == len(steps)
    want = sorted((s.name, st.index, s.kind, len(st.prompt), st.max_tokens) for s, st in steps)
    got = sorted((r.session, r.turn, r.kind, r.input_tokens, r.output_tokens) for r in requests)
    assert got == want
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    assert all(len(r.blocks) == -(-r.input_tokens // 128) for r in requests)


def test_first_turns_arrive_with_their_session_later_turns_wait_after_the_answer():
    sessions = {s.name: s for s in build_sessions(SPEC)}
    by_turn = {(r.session, r.turn): r for r in longctx_requests(SPEC)}
    for (name, turn), r in by_turn.items():
        session = sessions[name]
        if turn == 0:
            assert r.after_s is None and r.arrival_s == session.arrival_s
        else:
            assert r.after_s == session.turns[turn].delay_s > 0
            assert r.arrival_s == pytest.approx(by_turn[name, turn - 1].arrival_s + r.after_s)


def test_keys_are_shared_exactly_as_far_as_the_full_blocks_of_the_tokens_agree():
    steps = {(s.name, st.index): st.prompt for s, st in dry_run(build_sessions(SPEC))}
    by_turn = {(r.session, r.turn): r for r in longctx_requests(SPEC, block_tokens=100)}
    name = next(k[0] for k in sorted(by_turn) if k[0].startswith("chat"))
    first, second = by_turn[name, 0], by_turn[name, 1]
    assert steps[name, 1][: len(steps[name, 0])] == steps[name, 0]  # turn 1 extends turn 0
    full = len(steps[name, 0]) // 100
    assert len(steps[name, 0]) % 100  # turn 0 ends in a partial block
    assert second.blocks[:full] == first.blocks[:full]
    assert second.blocks[full] != first.blocks[full]  # turn 0's partial tail, completed
    system = SPEC.system_tokens // 100
    assert len({r.blocks[:system] for r in by_turn.values()}) == 1  # everyone's system prompt
    assert len({r.blocks[system] for r in by_turn.values()}) > 1


def test_token_block_keys_partial_tail_and_namespace():
    a = token_block_keys(list(range(10)), 4)
    b = token_block_keys([*range(8), 99, 98, 97], 4)
    assert len(a) == 3 and len(b) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert token_block_keys(list(range(8)), 4) == a[:2]
    assert token_block_keys(list(range(10)), 4, b"other") != a
    with pytest.raises(ConfigError, match="block_tokens"):
        token_block_keys([1], 0)
