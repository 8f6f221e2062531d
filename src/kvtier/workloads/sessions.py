"""Workloads for the live job: shared system prompts, growing chats, RAG over shared documents,
and agentic sessions that pause for a tool call and resume.

A workload is a list of sessions; each session is a list of turns. A turn's prompt is the
session's history (earlier prompts and the model's answers) plus new text, so the prompt of
turn ``t`` depends on what the model generated at turn ``t - 1``: the runner asks each session
for its next prompt only after it has the previous answer. Texts are pseudo-English drawn from a
seeded generator, so the same options give the same token ids on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kvtier.errors import ConfigError

Kind = Literal["chat", "rag", "agent"]
Tokenize = Callable[[str], list[int]]

_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an which have not "
    "cache memory prefix token model layer request server storage tier latency bandwidth policy "
    "decode prefill attention context window session user system agent tool result document "
    "retrieval answer question report engine kernel block chunk queue write read copy host device "
    "network object store shard replica index value key hash time second budget cost plan load "
    "compute recompute reuse evict admit promote long short fast slow large small first last new"
).split()


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape and size of the live workload. Token counts are approximate (text is tokenized).

    The defaults are `kvtier run`'s: sized so that both passes (kvtier and recompute-only), the
    model load and a quick calibration finish within 3 minutes on a 2-core CPU running the
    bf16 SmolLM2-135M (about 15 ms per prompt token there).
    """

    seed: int = 0
    system_tokens: int = 224
    chat_sessions: int = 2
    chat_turns: int = 3
    turn_tokens: int = 40
    docs: int = 1
    doc_tokens: int = 224
    rag_requests: int = 2
    question_tokens: int = 80
    agent_sessions: int = 1
    agent_steps: int = 3
    tool_result_tokens: int = 72
    tool_pause_s: float = 0.3
    max_new_tokens: int = 6

    def __post_init__(self) -> None:
        counts = (
            self.chat_sessions,
            self.chat_turns,
            self.docs,
            self.rag_requests,
            self.agent_sessions,
            self.agent_steps,
        )
        if min(counts) < 0 or min(self.system_tokens, self.turn_tokens, self.max_new_tokens) < 1:
            raise ConfigError("workload counts must be >= 0 and token counts >= 1")
        if self.rag_requests and not self.docs:
            raise ConfigError("RAG requests need at least one document (docs >= 1)")


@dataclass
class Turn:
    """One request: the text it adds to its session, and a pause before it (tool calls)."""

    new_text: str
    pause_s: float = 0.0


@dataclass
class Session:
    """A conversation whose prompt grows with each turn and each answer."""

    name: str
    kind: Kind
    preamble: str
    turns: list[Turn]
    history: list[int] = field(default_factory=list)

    def prompts(self, tokenize: Tokenize) -> Iterator[tuple[int, list[int], float]]:
        """Yield (turn index, prompt token ids, pause seconds); call ``answer`` between yields."""
        self.history = tokenize(self.preamble)
        for i, turn in enumerate(self.turns):
            self.history = self.history + tokenize(turn.new_text)
            yield i, list(self.history), turn.pause_s

    def answer(self, generated: Sequence[int]) -> None:
        """Append the model's answer to the history the next turn builds on."""
        self.history = self.history + list(generated)


class _Text:
    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def words(self, n_tokens: int, label: str) -> str:
        # ~1.3 tokens per word for this vocabulary with BPE tokenizers.
        n = max(1, int(n_tokens / 1.3))
        body = " ".join(self._rng.choice(_WORDS) for _ in range(n))
        return f"{label}: {body}.\n"


def build_sessions(spec: WorkloadSpec) -> list[Session]:
    """The sessions of a workload, in the order the runner interleaves them."""
    text = _Text(spec.seed)
    system = text.words(spec.system_tokens, "System")
    docs = [text.words(spec.doc_tokens, f"Document {d}") for d in range(spec.docs)]
    sessions: list[Session] = []
    for s in range(spec.chat_sessions):
        turns = [
            Turn(text.words(spec.turn_tokens, f"User {s}.{t}")) for t in range(spec.chat_turns)
        ]
        sessions.append(Session(f"chat-{s}", "chat", system, turns))
    for r in range(spec.rag_requests):
        doc = docs[r % len(docs)]
        question = Turn(text.words(spec.question_tokens, f"Question {r}"))
        sessions.append(Session(f"rag-{r}", "rag", system + doc, [question]))
    for a in range(spec.agent_sessions):
        steps = [Turn(text.words(spec.turn_tokens, f"Task {a}"))]
        steps += [
            Turn(text.words(spec.tool_result_tokens, f"Tool result {a}.{t}"), spec.tool_pause_s)
            for t in range(1, spec.agent_steps)
        ]
        sessions.append(Session(f"agent-{a}", "agent", system, steps))
    return sessions


def interleave(sessions: Sequence[Session]) -> list[tuple[int, int]]:
    """Round-robin schedule of (session index, turn index): turn t of every session, then t+1."""
    depth = max((len(s.turns) for s in sessions), default=0)
    return [(i, t) for t in range(depth) for i, s in enumerate(sessions) if t < len(s.turns)]
