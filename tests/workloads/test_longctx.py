"""The long-context workloads: seeded, long from the first prompt, prefixes really shared, and
each turn built on the previous prompt and answer."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.longctx import (
    LongContextSpec,
    build_sessions,
    dry_run,
    placeholder_answer,
    scaled,
)

SPEC = LongContextSpec()


def shape(sessions):
    return [(s.name, s.kind, s.arrival_s, s.context, [t.tokens for t in s.turns]) for s in sessions]


def test_same_seed_same_workload_another_seed_differs():
    assert shape(build_sessions(SPEC)) == shape(build_sessions(LongContextSpec()))
    other = build_sessions(replace(SPEC, seed=1))
    assert shape(other) != shape(build_sessions(SPEC))
    assert other[0].context[:64] != build_sessions(SPEC)[0].context[:64]


def test_every_kind_is_there_with_the_asked_counts():
    sessions = build_sessions(SPEC)
    kinds = [s.kind for s in sessions]
    assert kinds.count("chat") == SPEC.chat_sessions
    assert kinds.count("rag") == SPEC.rag_questions
    assert kinds.count("agent") == SPEC.agent_sessions
    assert kinds.count("code") == SPEC.code_bursts * SPEC.burst_requests
    assert sum(len(s.turns) for s in sessions) == SPEC.requests()
    steps = dry_run(sessions)
    assert len(steps) == SPEC.requests()


@pytest.mark.parametrize("f", [1.0, 0.5, 0.0])
def test_every_prompt_is_long_and_within_the_vocabulary(f):
    spec = scaled(SPEC, f)
    steps = [step for _, step in dry_run(build_sessions(spec))]
    assert min(len(s.prompt) for s in steps) >= spec.min_prompt_tokens == 2048
    assert max(len(s.prompt) for s in steps) == spec.longest_prompt_tokens()
    low, high = spec.vocab
    assert all(low <= t < high for s in steps for t in s.prompt[:: max(1, len(s.prompt) // 50)])


def test_sessions_share_the_system_prompt_documents_and_repositories():
    sessions = build_sessions(SPEC)
    system = sessions[0].context[: SPEC.system_tokens]
    assert all(s.context[: SPEC.system_tokens] == system for s in sessions)
    rag = [s for s in sessions if s.kind == "rag"]
    by_doc: dict[str, list] = {}
    for s in rag:
        by_doc.setdefault(s.name.split(".")[-1], []).append(s)
    assert len(by_doc) == SPEC.docs
    for same in by_doc.values():
        assert len(same) >= 2
        assert {s.context for s in same} == {same[0].context}  # the whole document shared
        assert len(same[0].context) == SPEC.system_tokens + SPEC.doc_tokens
    docs = {same[0].context for same in by_doc.values()}
    assert len(docs) == SPEC.docs  # different documents differ
    code = [s for s in sessions if s.kind == "code"]
    assert {s.context for s in code} == {code[0].context}
    assert len(code[0].context) == SPEC.system_tokens + SPEC.repo_tokens
    edits = [s.turns[0].tokens for s in code]
    assert len(set(edits)) == len(edits)  # every request of a burst has its own edit


def test_a_turn_is_the_previous_prompt_the_answer_and_new_tokens():
    chat = next(s for s in build_sessions(SPEC) if s.kind == "chat")
    steps = chat.steps()
    first = next(steps)
    assert first.delay_s == 0 and first.max_tokens == SPEC.output_tokens
    answer = [7, 8, 9] * 5 + [11]
    chat.answer(answer)
    second = next(steps)
    assert second.prompt[: len(first.prompt)] == first.prompt
    assert second.prompt[len(first.prompt) : len(first.prompt) + len(answer)] == answer
    assert len(second.prompt) == len(first.prompt) + len(answer) + SPEC.user_tokens
    assert second.delay_s == SPEC.think_s


def test_agents_pause_for_their_tools_and_resume_on_their_history():
    agent = next(s for s in build_sessions(SPEC) if s.kind == "agent")
    played = dry_run([agent])
    pauses = [step.delay_s for _, step in played]
    assert pauses == [0.0] + [SPEC.tool_pause_s] * (SPEC.agent_steps - 1)
    for (_, a), (_, b) in itertools.pairwise(played):
        assert b.prompt[: len(a.prompt)] == a.prompt
        assert b.prompt[len(a.prompt) : len(a.prompt) + a.max_tokens] == placeholder_answer(a)


def test_arrivals_are_ordered_spread_and_bursts_come_close_together():
    sessions = build_sessions(SPEC)
    arrivals = [s.arrival_s for s in sessions]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert arrivals[-1] > SPEC.arrival_gap_s * 3  # spread over time, not all at once
    for b in range(SPEC.code_bursts):
        burst = sorted(s.arrival_s for s in sessions if s.name.startswith(f"code-{b}."))
        gaps = [round(y - x, 6) for x, y in itertools.pairwise(burst)]
        assert gaps == [SPEC.burst_gap_s] * (SPEC.burst_requests - 1)


def test_a_document_comes_back_after_other_sessions_started():
    order = [s.name for s in build_sessions(SPEC)]
    for d in range(SPEC.docs):
        seen = [i for i, name in enumerate(order) if name.endswith(f".doc{d}")]
        assert len(seen) >= 2 and seen[1] - seen[0] > 2


def test_scaled_shrinks_towards_the_smallest_workload_that_keeps_its_shape():
    full, half, least = (scaled(SPEC, f) for f in (1.0, 0.5, 0.0))
    assert full == SPEC
    assert SPEC.requests() > half.requests() > least.requests() > 0
    tokens = [
        sum(len(s.prompt) for _, s in dry_run(build_sessions(x))) for x in (full, half, least)
    ]
    assert tokens[0] > tokens[1] > tokens[2]
    assert least.chat_turns == 2 and least.agent_steps == 2 and least.rag_questions == 2
    assert min(least.first_prompt_tokens().values()) == least.min_prompt_tokens
    with pytest.raises(ConfigError, match="scale"):
        scaled(SPEC, 1.5)


def test_bad_specs_are_refused():
    with pytest.raises(ConfigError, match="shorter than 2048"):
        LongContextSpec(chat_opening_tokens=100)
    with pytest.raises(ConfigError, match="negative"):
        LongContextSpec(docs=-1)
    with pytest.raises(ConfigError, match="document"):
        LongContextSpec(docs=0)
    with pytest.raises(ConfigError, match="vocab"):
        LongContextSpec(vocab=(5, 5))


def test_workload_files_are_read_and_bad_fields_named(tmp_path):
    from pathlib import Path

    import pytest

    from kvtier.errors import ConfigError
    from kvtier.workloads.longctx import LongContextSpec

    shipped = Path(__file__).parents[2] / "docs" / "benchmarks" / "sim" / "wl100.json"
    assert LongContextSpec.from_file(shipped).requests() == 103
    toml = tmp_path / "w.toml"
    toml.write_text("chat_sessions = 2\nvocab = [10, 20]\n")
    spec = LongContextSpec.from_file(toml)
    assert spec.chat_sessions == 2 and spec.vocab == (10, 20)
    bad = tmp_path / "bad.json"
    for text, says in (('{"chat_sesions": 1}', "chat_sesions"), ('{"docs": "two"}', "docs")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=says):
            LongContextSpec.from_file(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        LongContextSpec.from_file(tmp_path / "missing.json")
