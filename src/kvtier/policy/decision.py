"""Load-or-recompute: per request, how many cached chunks to bring back and from where.

For every candidate cut ``k`` (0 … the number of leading chunks found), the predicted time to first
logits is: wait behind loads already in flight on the tiers used + reload of chunks ``0..k``
from their tiers + prefill of the remaining tokens after ``k × chunk`` cached ones. The cut with the
least predicted time wins: ``k = 0`` is recompute, ``k = hits`` a full load, anything between
a partial load (the prefix up to where it pays).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kvtier.errors import ConfigError

Action = Literal["load", "partial", "recompute"]


class _Compute(Protocol):
    def prefill_seconds(self, new: int, cached: int = 0) -> float: ...


class _Path(Protocol):
    def seconds(self, raw_bytes: float) -> float: ...


@dataclass(frozen=True)
class Decision:
    """What to do for one request, with the predictions that chose it."""

    action: Action
    load_chunks: int
    hit_chunks: int
    load_tokens: int
    tiers: tuple[str, ...]
    predicted_load_s: float
    predicted_prefill_s: float
    predicted_recompute_s: float

    @property
    def predicted_s(self) -> float:
        """Predicted seconds until the model has the prompt's KV (load + remaining prefill)."""
        return self.predicted_load_s + self.predicted_prefill_s


class LoadOrRecompute:
    """Chooses the cut between reloaded and recomputed chunks that minimises predicted time."""

    def __init__(
        self,
        compute: _Compute,
        kv_bytes_per_token: float,
        paths: Mapping[str, _Path],
        chunk_tokens: int,
    ):
        if chunk_tokens <= 0 or kv_bytes_per_token <= 0:
            raise ConfigError("chunk_tokens and kv_bytes_per_token must be positive")
        self.compute = compute
        self.kv_bytes_per_token = kv_bytes_per_token
        self.paths = dict(paths)
        self.chunk_tokens = chunk_tokens

    def load_seconds(
        self, tiers: Sequence[str], queued_s: Mapping[str, float] | None = None
    ) -> float:
        """Predicted seconds to reload chunks held by ``tiers`` (one name per chunk)."""
        return self._load_counts(Counter(tiers), queued_s)

    def _load_counts(
        self, counts: Mapping[str, int], queued_s: Mapping[str, float] | None
    ) -> float:
        chunk_bytes = self.kv_bytes_per_token * self.chunk_tokens
        total = 0.0
        for tier, count in counts.items():
            path = self.paths.get(tier)
            if path is None:
                raise ConfigError(f"no transfer path calibrated for tier {tier!r}")
            total += path.seconds(chunk_bytes * count) + (queued_s or {}).get(tier, 0.0)
        return total

    def decide(
        self,
        prompt_tokens: int,
        hit_tiers: Sequence[str],
        queued_s: Mapping[str, float] | None = None,
        usable: int | None = None,
    ) -> Decision:
        """The best cut for a prompt whose leading chunks live on ``hit_tiers`` (in order).

        At least one prompt token is always left to compute, since the model must produce logits;
        ``load`` means every usable hit chunk is loaded, ``partial`` only a leading part.
        ``usable``: how many hit chunks may be loaded when the caller has already left the
        tokens to compute (an engine that computes the last token of a whole cached chunk);
        by default those that leave one prompt token.
        """
        if usable is None:
            usable = max(0, (prompt_tokens - 1) // self.chunk_tokens)
        usable = min(len(hit_tiers), max(0, usable))
        recompute = self.compute.prefill_seconds(prompt_tokens, 0)
        best = (recompute, 0, 0.0, recompute)
        counts: Counter[str] = Counter()
        per_tier: dict[str, float] = {}  # predicted seconds of each tier's share of the load
        chunk_bytes = self.kv_bytes_per_token * self.chunk_tokens
        queued = queued_s or {}
        load = 0.0
        for k in range(1, usable + 1):
            tier = hit_tiers[k - 1]
            counts[tier] += 1
            cached = k * self.chunk_tokens
            path = self.paths.get(tier)
            if path is None:
                raise ConfigError(f"no transfer path calibrated for tier {tier!r}")
            now = path.seconds(chunk_bytes * counts[tier]) + queued.get(tier, 0.0)
            load += now - per_tier.get(tier, 0.0)
            per_tier[tier] = now
            # an engine that recomputes the last token of a whole hit still runs one token
            prefill = self.compute.prefill_seconds(max(prompt_tokens - cached, 1), cached)
            if load + prefill < best[0]:
                best = (load + prefill, k, load, prefill)
        _, k, load, prefill = best
        action: Action = "recompute" if k == 0 else ("load" if k == usable else "partial")
        return Decision(
            action=action,
            load_chunks=k,
            hit_chunks=len(hit_tiers),
            load_tokens=k * self.chunk_tokens,
            tiers=tuple(sorted(set(hit_tiers[:k]))),
            predicted_load_s=load,
            predicted_prefill_s=prefill,
            predicted_recompute_s=recompute,
        )
