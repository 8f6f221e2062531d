"""The live job's sessions: seeded, shaped as asked, and interleaved turn by turn."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.sessions import WorkloadSpec, build_sessions, interleave


def words(text: str) -> list[int]:
    return [len(w) for w in text.split()]


def test_same_seed_same_sessions_and_another_seed_differs():
    spec = WorkloadSpec(seed=3)
    a, b = build_sessions(spec), build_sessions(spec)
    assert [(s.name, s.preamble, [t.new_text for t in s.turns]) for s in a] == [
        (s.name, s.preamble, [t.new_text for t in s.turns]) for s in b
    ]
    other = build_sessions(WorkloadSpec(seed=4))
    assert a[0].preamble != other[0].preamble


def test_kinds_share_the_system_prompt_and_rag_shares_documents():
    spec = WorkloadSpec(chat_sessions=2, rag_requests=2, docs=1, agent_sessions=1)
    sessions = build_sessions(spec)
    assert [s.kind for s in sessions] == ["chat", "chat", "rag", "rag", "agent"]
    system = sessions[0].preamble
    assert all(s.preamble.startswith(system) for s in sessions)
    assert sessions[2].preamble == sessions[3].preamble != system
    agent = sessions[4]
    assert agent.turns[0].pause_s == 0 and all(
        t.pause_s == spec.tool_pause_s for t in agent.turns[1:]
    )


def test_prompts_grow_with_each_turn_and_answer():
    session = build_sessions(WorkloadSpec(chat_sessions=1, rag_requests=0, agent_sessions=0))[0]
    turns = session.prompts(words)
    _, first, _ = next(turns)
    session.answer([99, 98])
    _, second, _ = next(turns)
    assert second[: len(first) + 2] == [*first, 99, 98] and len(second) > len(first) + 2


def test_interleave_is_round_robin_by_turn():
    sessions = build_sessions(
        WorkloadSpec(chat_sessions=2, chat_turns=2, rag_requests=1, agent_sessions=0)
    )
    assert interleave(sessions) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]


def test_bad_shapes_are_refused():
    with pytest.raises(ConfigError):
        WorkloadSpec(chat_sessions=-1)
    with pytest.raises(ConfigError):
        WorkloadSpec(docs=0, rag_requests=1)
