"""The load-or-recompute decision as the engine's hook, with a log of predicted vs actual time.

:class:`LoggedDecision` is an :data:`~kvtier.engines.hf.ReuseDecision` (a callable the HF engine
asks how many hit chunks to load). It asks :class:`~kvtier.policy.decision.LoadOrRecompute`,
adding the seconds each tier is still busy with work queued before this request
(:class:`QueueProbe`), and keeps the :class:`~kvtier.policy.decision.Decision` so that the
caller can pair it with what the engine then measured (:func:`decision_entry`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kvtier.policy.decision import Decision, LoadOrRecompute

#: Measured times within this fraction of each other are a tie: either choice is right.
TIE_FRACTION = 0.05


class QueueProbe:
    """Seconds of work already queued on each tier, read from the cache's write queues.

    A tier's queued chunks (``queue_depth`` in the cache metrics) must be written before a read
    that enters the same device behind them completes, so ``depth × chunk bytes`` at the tier's
    calibrated rate is added to that tier's predicted load. (The engine runs one request at a
    time, so no other loads are in flight; writes queued by earlier requests are.)
    """

    def __init__(self, cache, paths: Mapping[str, Any], chunk_bytes: int):
        self.cache = cache
        self.paths = dict(paths)
        self.chunk_bytes = chunk_bytes

    def depths(self) -> dict[str, int]:
        """Chunks waiting in each tier's write queue now."""
        tiers = self.cache.metrics.as_dict()["tiers"]
        return {name: int(tiers.get(name, {}).get("queue_depth", 0) or 0) for name in self.paths}

    def __call__(self) -> dict[str, float]:
        out = {}
        for name, depth in self.depths().items():
            if depth:
                out[name] = self.paths[name].seconds(depth * self.chunk_bytes)
        return out


class LoggedDecision:
    """A ReuseDecision backed by LoadOrRecompute; remembers each Decision it made.

    ``queued`` (e.g. a :class:`QueueProbe`) gives the seconds each tier is busy for; call
    :meth:`take` after each request to get (and clear) the decision made for it, or None when
    the engine did not ask (nothing usable was cached).
    """

    def __init__(
        self,
        policy: LoadOrRecompute,
        queued: Callable[[], Mapping[str, float]] | None = None,
    ):
        self.policy = policy
        self.queued = queued
        self._last: tuple[Decision, dict[str, float], int] | None = None

    def __call__(self, query) -> int:
        queued = dict(self.queued()) if self.queued is not None else {}
        decision = self.policy.decide(query.prompt_tokens, query.tier_names, queued_s=queued)
        self._last = (decision, queued, int(query.usable_chunks))
        return decision.load_chunks

    def take(self) -> tuple[Decision, dict[str, float], int] | None:
        """(decision, queued seconds per tier, usable chunks) of the last request, or None."""
        last, self._last = self._last, None
        return last


@dataclass
class DecisionEntry:
    """One request's decision: what was predicted, what was measured, and whether it paid.

    ``action`` is ``load``, ``partial``, ``recompute`` or ``miss`` (nothing usable cached: no
    choice to make; the prediction is a full prefill). ``actual_s`` is the engine's measured
    load (incl. the copy into the model's KV) plus prefill, the quantity ``predicted_s`` predicts.
    ``alternative_s`` is the measured time of the other path where it was measured (a full
    recompute of the same prompt); ``faster`` says whether the chosen path was the faster one
    (ties within :data:`TIE_FRACTION` count as right), None when not measured.
    """

    action: str
    hit_chunks: int
    usable_chunks: int
    load_chunks: int
    tiers: tuple[str, ...]
    queued_s: dict[str, float]
    predicted_load_s: float
    predicted_prefill_s: float
    predicted_recompute_s: float
    actual_load_s: float
    actual_prefill_s: float
    alternative_s: float | None = None
    faster: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted_s(self) -> float:
        """Predicted seconds of the chosen path (load + prefill)."""
        return self.predicted_load_s + self.predicted_prefill_s

    @property
    def actual_s(self) -> float:
        """Measured seconds of the chosen path (load + prefill)."""
        return self.actual_load_s + self.actual_prefill_s

    @property
    def error(self) -> float:
        """Relative prediction error ``(predicted − actual) / actual``."""
        return (self.predicted_s - self.actual_s) / self.actual_s if self.actual_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with the derived totals and error."""
        out = asdict(self)
        out["tiers"] = list(self.tiers)
        out.pop("extra")
        out.update(self.extra)
        out["predicted_s"] = self.predicted_s
        out["actual_s"] = self.actual_s
        out["error"] = self.error
        return out


def decision_entry(record, made, compute) -> DecisionEntry:
    """Pair the engine's :class:`~kvtier.engines.hf.RequestRecord` with the decision it used.

    ``made`` is :meth:`LoggedDecision.take`'s result (None: a miss); ``compute`` the
    ComputeModel that predicts prefill time.
    """
    n = record.prompt_tokens
    recompute = compute.prefill_seconds(n, 0)
    if made is None:
        return DecisionEntry(
            action="miss",
            hit_chunks=record.hit_chunks,
            usable_chunks=0,
            load_chunks=0,
            tiers=(),
            queued_s={},
            predicted_load_s=0.0,
            predicted_prefill_s=recompute,
            predicted_recompute_s=recompute,
            actual_load_s=record.load_s,
            actual_prefill_s=record.prefill_s,
        )
    decision, queued, usable = made
    return DecisionEntry(
        action=decision.action,
        hit_chunks=decision.hit_chunks,
        usable_chunks=usable,
        load_chunks=decision.load_chunks,
        tiers=decision.tiers,
        queued_s=queued,
        predicted_load_s=decision.predicted_load_s,
        predicted_prefill_s=decision.predicted_prefill_s,
        predicted_recompute_s=decision.predicted_recompute_s,
        actual_load_s=record.load_s,
        actual_prefill_s=record.prefill_s,
    )


def judge(entry: DecisionEntry, chosen_ttft_s: float, recompute_ttft_s: float | None) -> None:
    """Fill ``alternative_s``/``faster`` from a measured full recompute of the same prompt.

    Compares time to first token both ways (kvtier's includes hashing, lookup and load). Only
    load and partial decisions have that alternative measured; a recompute (or a miss) ran the
    very path it is compared with, so it stays unjudged (None).
    """
    if recompute_ttft_s is None or entry.action not in ("load", "partial"):
        return
    entry.alternative_s = recompute_ttft_s
    entry.faster = chosen_ttft_s <= recompute_ttft_s * (1 + TIE_FRACTION)
