"""Token-level long-context workloads: chats, RAG, agentic sessions and code-assistant bursts.

Prompts are lists of token ids drawn from a seeded generator (no tokenizer, no text), long from
the first request on (the first prompt of every session is at least ``min_prompt_tokens``):

- **chat**: sessions share the system prompt; each turn is the previous prompt, the model's
  answer and a new user message, after a short think time;
- **rag**: one-shot questions over long shared documents (system prompt + document + question),
  a document asked about again later, after other sessions pushed it out of engine memory;
- **agent**: a task, then tool results; before each tool result the session pauses (the tool
  runs for seconds) and resumes on its whole history;
- **code**: bursts of requests a few hundred milliseconds apart over one repository context
  (system prompt + repository + an edit), the same repository coming back in a later burst.

Sessions arrive at seeded, gamma-spaced times, the kinds taking turns. A session's next prompt
depends on the previous answer, so a runner asks for it only after that answer
(:meth:`Session.steps`, then :meth:`Session.answer`); :func:`dry_run` plays a workload with
placeholder answers, for sizing and for a simulator. Nothing here talks to an engine.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kvtier.errors import ConfigError

Kind = Literal["chat", "rag", "agent", "code"]
KINDS: tuple[Kind, ...] = ("chat", "rag", "agent", "code")


@dataclass(frozen=True)
class LongContextSpec:
    """Shape and size of a long-context workload (token counts are exact).

    ``vocab`` bounds the drawn token ids (``[low, high)``); ``output_tokens`` is the answer
    length asked of the engine per request; ``arrival_gap_s`` the mean gap between session
    starts (a code burst starts once, its requests ``burst_gap_s`` apart).
    """

    seed: int = 0
    vocab: tuple[int, int] = (1000, 40000)
    min_prompt_tokens: int = 2048
    output_tokens: int = 16
    arrival_gap_s: float = 1.5
    system_tokens: int = 1024
    chat_sessions: int = 3
    chat_turns: int = 4
    chat_opening_tokens: int = 1280
    user_tokens: int = 256
    think_s: float = 1.0
    docs: int = 2
    doc_tokens: int = 3072
    rag_questions: int = 4
    question_tokens: int = 128
    agent_sessions: int = 2
    agent_steps: int = 4
    task_tokens: int = 1280
    tool_tokens: int = 512
    tool_pause_s: float = 4.0
    repos: int = 1
    repo_tokens: int = 4096
    code_bursts: int = 2
    burst_requests: int = 3
    edit_tokens: int = 192
    burst_gap_s: float = 0.3

    def __post_init__(self) -> None:
        low, high = self.vocab
        if not 0 <= low < high:
            raise ConfigError(f"vocab must be [low, high) with 0 <= low < high, got {self.vocab}")
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}
        negative = [name for name, value in counts.items() if value < 0]
        if negative:
            raise ConfigError(f"workload counts cannot be negative: {', '.join(negative)}")
        if self.output_tokens < 1 or self.system_tokens < 1:
            raise ConfigError("output_tokens and system_tokens must be at least 1")
        if self.rag_questions and not self.docs:
            raise ConfigError("RAG questions need at least one document (docs >= 1)")
        if self.code_bursts and not (self.repos and self.burst_requests):
            raise ConfigError("code bursts need a repository and requests (repos, burst_requests)")
        pauses = (self.arrival_gap_s, self.think_s, self.tool_pause_s, self.burst_gap_s)
        if min(pauses) < 0:
            raise ConfigError("arrival gaps, think times and pauses cannot be negative")
        short = {k: n for k, n in self.first_prompt_tokens().items() if n < self.min_prompt_tokens}
        if short:
            named = ", ".join(f"{k} {n}" for k, n in short.items())
            raise ConfigError(
                f"first prompts shorter than {self.min_prompt_tokens} tokens: {named}; "
                "give longer openings, documents, tasks or repositories"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "workload") -> LongContextSpec:
        """A spec from plain values (a JSON/TOML table): unknown names and wrong kinds are a
        ConfigError naming them; missing ones keep their defaults."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                f"{where}: unknown workload field(s) {', '.join(unknown)}; known: "
                + ", ".join(sorted(known))
            )
        kinds = {"int": int, "float": (int, float), "tuple[int, int]": (list, tuple)}
        out: dict[str, Any] = {}
        for name, value in values.items():
            want = kinds.get(str(known[name].type))
            if want is None or isinstance(value, bool) or not isinstance(value, want):
                raise ConfigError(f"{where}: {name} = {value!r} is not a {known[name].type}")
            if name == "vocab":
                if len(value) != 2 or not all(isinstance(v, int) for v in value):
                    raise ConfigError(f"{where}: vocab is [low, high], got {value!r}")
                value = (int(value[0]), int(value[1]))
            out[name] = value
        return cls(**out)

    @classmethod
    def from_file(cls, path: Path) -> LongContextSpec:
        """A spec from a JSON or TOML file of its fields (see :meth:`from_mapping`)."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the workload file ({exc.strerror})") from None
        try:
            is_toml = path.suffix.lower() == ".toml"
            values = tomllib.loads(text) if is_toml else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(
                f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}"
            ) from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: a workload file holds one table of fields")
        return cls.from_mapping(values, str(path))

    def first_prompt_tokens(self) -> dict[Kind, int]:
        """Length of the first prompt of each kind of session present in the workload."""
        s = self.system_tokens
        out: dict[Kind, int] = {}
        if self.chat_sessions and self.chat_turns:
            out["chat"] = s + self.chat_opening_tokens
        if self.rag_questions:
            out["rag"] = s + self.doc_tokens + self.question_tokens
        if self.agent_sessions and self.agent_steps:
            out["agent"] = s + self.task_tokens
        if self.code_bursts:
            out["code"] = s + self.repo_tokens + self.edit_tokens
        return out

    def longest_prompt_tokens(self) -> int:
        """Length of the longest prompt the workload sends (answers at ``output_tokens``)."""
        grow = {
            "chat": max(self.chat_turns - 1, 0) * (self.output_tokens + self.user_tokens),
            "agent": max(self.agent_steps - 1, 0) * (self.output_tokens + self.tool_tokens),
        }
        return max(
            (n + grow.get(k, 0) for k, n in self.first_prompt_tokens().items()),
            default=0,
        )

    def requests(self) -> int:
        """Requests in the workload."""
        return (
            self.chat_sessions * self.chat_turns
            + self.rag_questions
            + self.agent_sessions * self.agent_steps
            + self.code_bursts * self.burst_requests
        )


@dataclass(frozen=True)
class Turn:
    """What one request adds to its session, after a wait (think time, a tool call)."""

    tokens: tuple[int, ...]
    delay_s: float = 0.0


@dataclass(frozen=True)
class Step:
    """One request of a session: its prompt, how long to wait before sending it, answer size."""

    session: str
    index: int
    prompt: list[int]
    delay_s: float
    max_tokens: int


@dataclass
class Session:
    """A session: a shared context, then turns; each prompt extends the previous one.

    ``arrival_s`` is when the session starts, from the start of the workload; the first turn's
    ``delay_s`` counts from there, the others' from the previous answer.
    """

    name: str
    kind: Kind
    arrival_s: float
    context: tuple[int, ...]
    turns: list[Turn]
    max_tokens: int
    history: list[int] = field(default_factory=list)

    def steps(self) -> Iterator[Step]:
        """The session's requests in order; call :meth:`answer` before asking for the next."""
        self.history = list(self.context)
        for i, turn in enumerate(self.turns):
            self.history = self.history + list(turn.tokens)
            yield Step(self.name, i, list(self.history), turn.delay_s, self.max_tokens)

    def answer(self, token_ids: list[int]) -> None:
        """Append the engine's answer to the history the next turn builds on."""
        self.history = self.history + [int(t) for t in token_ids]


class _Tokens:
    """Seeded token ids in ``[low, high)``."""

    def __init__(self, seed: int, vocab: tuple[int, int]):
        self._rng = np.random.default_rng(seed)
        self._low, self._high = vocab

    def draw(self, n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in self._rng.integers(self._low, self._high, n))


def build_sessions(spec: LongContextSpec) -> list[Session]:
    """The sessions of a workload, ordered by arrival time (deterministic for a seed)."""
    tok = _Tokens(spec.seed, spec.vocab)
    rng = np.random.default_rng([spec.seed, 1])
    out_n = spec.output_tokens
    system = tok.draw(spec.system_tokens)
    docs = [tok.draw(spec.doc_tokens) for _ in range(spec.docs)]
    repos = [tok.draw(spec.repo_tokens) for _ in range(spec.repos)]
    # Each entry: a function of the start time giving the sessions starting then.
    starts: list[Callable[[float], list[Session]]] = []

    def conversation(
        kind: Kind, i: int, opening: int, follow: int, delay_s: float, n: int
    ) -> Callable[[float], list[Session]]:
        # A chat or an agent: an opening message, then n - 1 follow-ups, each after a wait.
        turns = [Turn(tok.draw(opening))]
        turns += [Turn(tok.draw(follow), delay_s) for _ in range(n - 1)]
        return lambda t: [Session(f"{kind}-{i}", kind, t, system, turns, out_n)]

    def chat(c: int) -> Callable[[float], list[Session]]:
        return conversation(
            "chat", c, spec.chat_opening_tokens, spec.user_tokens, spec.think_s, spec.chat_turns
        )

    def rag(q: int) -> Callable[[float], list[Session]]:
        d = q % spec.docs
        turns = [Turn(tok.draw(spec.question_tokens))]
        return lambda t: [Session(f"rag-{q}.doc{d}", "rag", t, system + docs[d], turns, out_n)]

    def agent(a: int) -> Callable[[float], list[Session]]:
        return conversation(
            "agent", a, spec.task_tokens, spec.tool_tokens, spec.tool_pause_s, spec.agent_steps
        )

    def burst(b: int) -> Callable[[float], list[Session]]:
        r = b % spec.repos
        edits = [tok.draw(spec.edit_tokens) for _ in range(spec.burst_requests)]
        context = system + repos[r]
        return lambda t: [
            Session(
                f"code-{b}.{i}.repo{r}", "code", t + i * spec.burst_gap_s, context, [Turn(e)], out_n
            )
            for i, e in enumerate(edits)
        ]

    by_kind: list[list[Callable[[float], list[Session]]]] = [
        [chat(c) for c in range(spec.chat_sessions)] if spec.chat_turns else [],
        [rag(q) for q in range(spec.rag_questions)],
        [agent(a) for a in range(spec.agent_sessions)] if spec.agent_steps else [],
        [burst(b) for b in range(spec.code_bursts)],
    ]
    # Kinds take turns (in a seeded order), so a document or repository comes back only after
    # the other kinds' sessions: what it left in engine memory has had time to be evicted.
    kinds = [by_kind[int(k)] for k in rng.permutation(len(by_kind))]
    for r in range(max(len(k) for k in kinds)):
        starts += [k[r] for k in kinds if r < len(k)]
    # Gamma-distributed gaps (shape 4): arrivals vary without the bursts of a Poisson process.
    gaps = rng.gamma(4.0, spec.arrival_gap_s / 4.0, len(starts)) if spec.arrival_gap_s else None
    sessions: list[Session] = []
    t = 0.0
    for k, start in enumerate(starts):
        if k and gaps is not None:
            t += float(gaps[k])
        sessions += start(round(t, 3))
    return sorted(sessions, key=lambda s: (s.arrival_s, s.name))


def placeholder_answer(step: Step) -> list[int]:
    """A stand-in answer of ``max_tokens`` ids, derived from the prompt (same prompt, same ids)."""
    rng = np.random.default_rng([len(step.prompt), *step.prompt[-4:]])
    return [int(t) for t in rng.integers(1000, 40000, step.max_tokens)]


def dry_run(
    sessions: list[Session], answer: Callable[[Step], list[int]] = placeholder_answer
) -> list[tuple[Session, Step]]:
    """Every request of ``sessions`` (session by session), answering each with ``answer``."""
    out: list[tuple[Session, Step]] = []
    for session in sessions:
        for step in session.steps():
            out.append((session, step))
            session.answer(answer(step))
    return out


def scaled(spec: LongContextSpec, f: float) -> LongContextSpec:
    """A smaller workload of the same shape: ``f`` = 1 is ``spec``, 0 the smallest one.

    Counts shrink towards one session of each kind present (chats and agents keep two turns,
    RAG and code keep a repeat so reuse stays), lengths towards what keeps every first prompt
    at ``min_prompt_tokens``.
    """
    if not 0 <= f <= 1:
        raise ConfigError(f"scale must be within [0, 1], got {f}")
    if f == 1:
        return spec

    low = spec.min_prompt_tokens - spec.system_tokens

    def toward(name: str, floor: int) -> dict[str, int]:
        n = getattr(spec, name)
        return {name: n if n <= floor else round(floor + (n - floor) * f)}

    def talks(sessions: str, turns: str, opening: str, follow: str, least: int) -> dict[str, int]:
        # Chats and agents: one session of two turns, the opening at the floor.
        return toward(sessions, 1) | toward(turns, 2) | toward(opening, low) | toward(follow, least)

    def asked(contexts: str, tokens: str, asks: str, ask_tokens: str) -> dict[str, int]:
        # RAG documents and code repositories: one context, asked about twice where there is one.
        floor = low - getattr(spec, ask_tokens)
        twice = 2 * min(getattr(spec, contexts), 1)
        return toward(contexts, 1) | toward(tokens, floor) | toward(asks, twice)

    return replace(
        spec,
        **talks("chat_sessions", "chat_turns", "chat_opening_tokens", "user_tokens", 64),
        **asked("docs", "doc_tokens", "rag_questions", "question_tokens"),
        **talks("agent_sessions", "agent_steps", "task_tokens", "tool_tokens", 128),
        **asked("repos", "repo_tokens", "code_bursts", "edit_tokens"),
        **toward("burst_requests", 2),
    )


__all__ = [
    "KINDS",
    "Kind",
    "LongContextSpec",
    "Session",
    "Step",
    "Turn",
    "build_sessions",
    "dry_run",
    "placeholder_answer",
    "scaled",
]
