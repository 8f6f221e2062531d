"""Admission per workload: a block goes to a slow tier only if its expected reuse repays the store.

Before a request the runner records what each chunk of the prompt is worth in a hint store
(:class:`kvtier.cache.hints.ReuseHints`): its expected number of future reuses (a prior per
workload kind and prompt region, see :data:`REUSE_PRIORS`) times the seconds one reuse saves
(predicted prefill of the chunk at its position minus its reload). :class:`HintedAdmission`, set
on a slow tier's :class:`~kvtier.cache.TierOptions`, admits a block when that value is at least
the tier's cost of storing it (its bytes at the tier's calibrated rate). The comparison is
:class:`~kvtier.policy.admission.MinValueAdmission`'s (seconds saved per byte stored).

So the system prompt and shared documents go everywhere, chat and agent history (resumed on the
next turn) too, while the unique tail of a one-shot RAG question, which nothing will ask for
again, stays out of the slow tiers (the fast tier still takes it).

Pure objects: no locks, no I/O. The hint store that several threads share lives with the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kvtier.errors import ConfigError
from kvtier.policy.admission import MinValueAdmission

#: Expected future reuses of a chunk, by workload kind and prompt region. ``shared``: the
#: chunks inside a session's preamble (system prompt, RAG document) that other sessions share;
#: after it, a chat or agent history is resumed by the next turn, a RAG question never again.
REUSE_PRIORS: Mapping[str, float] = {
    "shared": 2.0,
    "chat": 1.0,
    "agent": 1.0,
    "rag": 0.0,
}


@dataclass(frozen=True)
class ChunkValue:
    """What one chunk is expected to save: ``reuses`` × ``saved_s`` seconds."""

    region: str
    reuses: float
    saved_s: float

    @property
    def value_s(self) -> float:
        """Expected seconds saved over the chunk's future reuses."""
        return self.reuses * max(self.saved_s, 0.0)


class HintSource(Protocol):
    """Where :class:`HintedAdmission` reads the hinted value of a key."""

    def get(self, key: bytes) -> ChunkValue | None:
        """The hint for ``key``, or None when none was given."""
        ...


class HintedAdmission:
    """Admits a block when its hinted value repays ``store_s_per_byte`` × its size.

    Blocks without a hint are admitted (nothing is known against them). Counts what it did in
    ``admitted``/``refused`` (per region).
    """

    def __init__(self, hints: HintSource, store_s_per_byte: float, store_latency_s: float = 0.0):
        if store_s_per_byte < 0 or store_latency_s < 0:
            raise ConfigError("store costs cannot be negative")
        self.hints = hints
        self.store_latency_s = store_latency_s
        self._policy = MinValueAdmission(store_s_per_byte, require_value=True)
        self.admitted: dict[str, int] = {}
        self.refused: dict[str, int] = {}

    def admit(self, key: bytes, size: int, value: float = 0.0) -> bool:
        hint = self.hints.get(key)
        if hint is None:
            return True
        worth = hint.value_s - self.store_latency_s
        ok = self._policy.admit(key, size, worth)
        book = self.admitted if ok else self.refused
        book[hint.region] = book.get(hint.region, 0) + 1
        return ok


def chunk_values(
    kind: str,
    shared_tokens: int,
    chunks: int,
    chunk_tokens: int,
    prefill_seconds,
    reload_seconds: float,
    priors: Mapping[str, float] = REUSE_PRIORS,
) -> list[ChunkValue]:
    """The value of each full chunk of a prompt of a session of ``kind``.

    Chunks wholly inside the first ``shared_tokens`` (the session's preamble) are ``shared``;
    later ones take the prior of ``kind``. ``prefill_seconds(new, cached)`` predicts the prefill
    a reuse saves; ``reload_seconds`` is the cost of one reuse (a chunk's reload).
    """
    out = []
    for j in range(chunks):
        start, end = j * chunk_tokens, (j + 1) * chunk_tokens
        region = "shared" if end <= shared_tokens else kind
        saved = prefill_seconds(chunk_tokens, start) - reload_seconds
        out.append(ChunkValue(region, float(priors.get(region, 1.0)), saved))
    return out
