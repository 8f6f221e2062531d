"""Token-free generated workloads for the simulator at scale: requests made from lengths alone.

No token lists: every stretch of new content (a user message, an answer, a document) gets fresh
block ids from a seeded counter, and a prompt's blocks are the chained keys
(:func:`~kvtier.workloads.requests.extend_keys`) of its history's blocks, so requests share
exactly the blocks a real prompt would: a block is shared when all the tokens up to its end are.
A block cut by the end of one stretch and continued by the next holds new content, so it gets a
new id. Tens of thousands of requests generate in about a second.

- :func:`unique_prompts`: one-shot prompts with no reuse at all (the cache's worst case);
- :func:`mix_requests`: sessions of four kinds sharing one system prompt (see :class:`MixSpec`):
  **chat** (turns on the growing history after a think time), **rag** (one-shot questions over
  shared documents, some documents far more asked about than others), **agent** (a task, then
  tool results after tool pauses, on the whole history) and **code** (bursts of one-shot edits
  a fraction of a second apart over a shared repository).

Later turns follow the rule of :mod:`~kvtier.workloads.longctx_trace`: ``after_s`` is the pause
after the previous answer, ``arrival_s`` the earliest the turn could come.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import xxhash

from kvtier.errors import ConfigError
from kvtier.workloads.arrivals import bursty
from kvtier.workloads.requests import TraceRequest, extend_keys

MIX_KINDS = ("chat", "rag", "agent", "code")


class _Prompt:
    """A token-free prompt: keys of its full blocks and the length of its partial tail."""

    __slots__ = ("_block", "_root", "full", "ids", "tail", "tail_key", "tokens")

    def __init__(self, root: bytes, ids: Iterator[int], block_tokens: int):
        self.full: list[bytes] = []
        self.ids = ids
        self.tokens = 0
        self.tail = 0
        self.tail_key = root
        self._root = root
        self._block = block_tokens

    def copy(self) -> _Prompt:
        out = _Prompt(self._root, self.ids, self._block)
        out.full = list(self.full)
        out.tokens, out.tail, out.tail_key = self.tokens, self.tail, self.tail_key
        return out

    def append(self, n: int) -> None:
        """Add ``n`` tokens of new content."""
        if n <= 0:
            return
        start = self.tokens
        self.tokens += n
        # Every block from the one the new content starts in (the partial tail, if any) to the
        # one it ends in holds new content: fresh ids, chained after the last full block.
        first, last = start // self._block, -(-self.tokens // self._block)
        prev = self.full[-1] if self.full else self._root
        keys = extend_keys(prev, itertools.islice(self.ids, last - first))
        self.tail = self.tokens % self._block
        if self.tail:
            self.full.extend(keys[:-1])
            self.tail_key = keys[-1]
        else:
            self.full.extend(keys)

    def blocks(self) -> tuple[bytes, ...]:
        return (*self.full, self.tail_key) if self.tail else tuple(self.full)


class _Uniform:
    """Uniform draws in [0, 1) from ``rng``, fetched in batches (one numpy call per batch)."""

    def __init__(self, rng: np.random.Generator, batch: int = 1 << 14):
        self._rng, self._batch = rng, batch
        self._left: Iterator[float] = iter(())

    def next(self) -> float:
        for value in self._left:
            return value
        self._left = iter(self._rng.random(self._batch).tolist())
        return next(self._left)


def _root(namespace: bytes, seed: int) -> bytes:
    return xxhash.xxh3_128_digest(namespace + b"/" + str(seed).encode())


def unique_prompts(
    arrivals: Sequence[float],
    input_tokens: int | tuple[int, int],
    output_tokens: int | tuple[int, int],
    *,
    block_tokens: int = 512,
    seed: int = 0,
    namespace: bytes = b"unique",
) -> list[TraceRequest]:
    """One-shot requests at ``arrivals`` whose prompts share no block with any other.

    Lengths are fixed, or drawn uniformly from ``[low, high]`` when given as a pair.
    """
    if block_tokens < 1:
        raise ConfigError(f"block_tokens must be at least 1, got {block_tokens}")
    rng = np.random.default_rng([seed, 0x0111])
    n = len(arrivals)
    n_in, n_out = _lengths(rng, input_tokens, n, 1), _lengths(rng, output_tokens, n, 0)
    ids = itertools.count()
    root = _root(namespace, seed)
    out = []
    for t, i, o in zip(arrivals, n_in.tolist(), n_out.tolist(), strict=True):
        prompt = _Prompt(root, ids, block_tokens)
        prompt.append(i)
        out.append(TraceRequest(float(t), i, o, prompt.blocks(), block_tokens))
    return sorted(out, key=lambda r: r.arrival_s)


def _lengths(rng: np.random.Generator, spec: int | tuple[int, int], n: int, low: int) -> np.ndarray:
    lo, hi = (spec, spec) if isinstance(spec, int) else spec
    if not low <= lo <= hi:
        raise ConfigError(f"token lengths must be {low} <= low <= high, got {spec}")
    return rng.integers(lo, hi + 1, n)


@dataclass(frozen=True)
class MixSpec:
    """A large generated workload: ``sessions`` sessions arriving at ``rate_per_s`` (gamma gaps of
    shape ``burstiness``, 1 = Poisson), each of a kind drawn with ``weights`` (chat, rag, agent,
    code). Every length (tokens) and pause (s) is a mean: each draw is uniform within
    ``± spread`` of it. RAG documents and code repositories are picked with Zipf-like
    popularity (weight ``1 / rank ** popularity``).
    """

    seed: int = 0
    sessions: int = 1000
    rate_per_s: float = 1.0
    burstiness: float = 1.0
    weights: tuple[float, float, float, float] = (0.4, 0.3, 0.2, 0.1)
    block_tokens: int = 512
    spread: float = 0.5
    output_tokens: int = 256
    system_tokens: int = 2048
    chat_turns: int = 5
    chat_opening_tokens: int = 1024
    user_tokens: int = 256
    think_s: float = 5.0
    docs: int = 50
    doc_tokens: int = 8192
    question_tokens: int = 128
    agent_steps: int = 6
    task_tokens: int = 2048
    tool_tokens: int = 1024
    tool_pause_s: float = 3.0
    repos: int = 10
    repo_tokens: int = 16384
    burst_requests: int = 4
    edit_tokens: int = 256
    burst_gap_s: float = 0.5
    popularity: float = 1.0
    namespace: bytes = b"mix"

    def __post_init__(self) -> None:
        numbers = {
            f.name: getattr(self, f.name) for f in fields(self) if f.type in ("int", "float")
        }
        negative = [name for name, value in numbers.items() if value < 0]
        if negative:
            raise ConfigError(
                f"workload sizes and pauses cannot be negative: {', '.join(negative)}"
            )
        if len(self.weights) != 4 or min(self.weights) < 0 or not sum(self.weights) > 0:
            raise ConfigError(
                f"weights are four shares >= 0 (chat, rag, agent, code), got {self.weights}"
            )
        if not 0 <= self.spread < 1:
            raise ConfigError(f"spread must be within [0, 1), got {self.spread}")
        positive = ["rate_per_s", "burstiness", "block_tokens", "system_tokens"]
        for share, names in zip(self.weights, _NEEDS, strict=True):
            positive += names if share else []
        zero = [name for name in positive if not getattr(self, name) > 0]
        if zero:
            raise ConfigError(f"must be positive for this mix: {', '.join(zero)}")


#: The fields of a conversation kind: turns, first and later message tokens, pause before a turn.
_CONVERSATIONS = {
    "chat": ("chat_turns", "chat_opening_tokens", "user_tokens", "think_s"),
    "agent": ("agent_steps", "task_tokens", "tool_tokens", "tool_pause_s"),
}
#: What each kind (chat, rag, agent, code) needs to be more than zero.
_NEEDS = (["chat_turns"], ["docs"], ["agent_steps"], ["repos", "burst_requests"])


def mix_requests(spec: MixSpec) -> list[TraceRequest]:
    """Every request of the generated workload ``spec``, sorted by arrival (stable)."""
    rng = np.random.default_rng([spec.seed, 0x313])
    starts = bursty(spec.rate_per_s, spec.sessions, spec.seed, burstiness=spec.burstiness)
    weights = np.asarray(spec.weights, dtype=float)
    picks = rng.choice(len(MIX_KINDS), size=spec.sessions, p=weights / weights.sum())
    kinds = [MIX_KINDS[k] for k in picks.tolist()]
    ids = itertools.count()
    bt = spec.block_tokens
    system = _Prompt(_root(spec.namespace, spec.seed), ids, bt)
    system.append(spec.system_tokens)

    uniform = _Uniform(rng)
    width = 2.0 * spec.spread

    def size(mean: float) -> float:
        return mean * (1.0 - spec.spread + width * uniform.next())

    def tokens(mean: int, least: int = 1) -> int:
        return max(least, round(size(mean)))

    def shared(count: int, length: int) -> tuple[list[_Prompt], np.ndarray]:
        contexts = []
        for _ in range(count):
            context = system.copy()
            context.append(length)
            contexts.append(context)
        rank = np.arange(1, count + 1, dtype=float) ** -spec.popularity
        return contexts, rank / rank.sum()

    docs, doc_p = shared(spec.docs, spec.doc_tokens) if spec.weights[1] else ([], None)
    repos, repo_p = shared(spec.repos, spec.repo_tokens) if spec.weights[3] else ([], None)
    doc_picks = rng.choice(len(docs), size=spec.sessions, p=doc_p).tolist() if docs else []
    repo_picks = rng.choice(len(repos), size=spec.sessions, p=repo_p).tolist() if repos else []
    out: list[TraceRequest] = []

    def emit(
        prompt: _Prompt, t: float, name: str, turn: int, kind: str, after: float | None
    ) -> None:
        out.append(
            TraceRequest(
                t,
                prompt.tokens,
                tokens(spec.output_tokens),
                prompt.blocks(),
                bt,
                session=name,
                turn=turn,
                kind=kind,
                after_s=after,
            )
        )

    def conversation(t: float, name: str, kind: str) -> None:
        turns_mean, opening, later, pause = (getattr(spec, f) for f in _CONVERSATIONS[kind])
        prompt = system.copy()
        prompt.append(tokens(opening))
        emit(prompt, t, name, 0, kind, None)
        for turn in range(1, max(1, round(size(turns_mean)))):
            prompt.append(out[-1].output_tokens)
            prompt.append(tokens(later))
            wait = max(0.0, size(pause))
            t += wait
            emit(prompt, t, name, turn, kind, wait)

    for s, (start, kind) in enumerate(zip(starts.tolist(), kinds, strict=True)):
        if kind in _CONVERSATIONS:
            conversation(start, f"{kind}-{s}", kind)
        elif kind == "rag":
            d = doc_picks[s]
            prompt = docs[d].copy()
            prompt.append(tokens(spec.question_tokens))
            emit(prompt, start, f"rag-{s}.doc{d}", 0, "rag", None)
        else:
            r = repo_picks[s]
            for i in range(spec.burst_requests):
                prompt = repos[r].copy()
                prompt.append(tokens(spec.edit_tokens))
                emit(prompt, start + i * spec.burst_gap_s, f"code-{s}.{i}.repo{r}", 0, "code", None)
    return sorted(out, key=lambda r: r.arrival_s)


__all__ = ["MIX_KINDS", "MixSpec", "mix_requests", "unique_prompts"]
