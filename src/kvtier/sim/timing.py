"""How long one engine step takes: the batch's prefill chunks and decodes, in seconds.

A step runs every scheduled sequence in one forward, as vLLM does. Two timers:

- :class:`RooflineTimer`: from specs (``cost.RooflineCompute``): the step is compute-bound on
  its prefill FLOPs or memory-bound on reading the weights and the batch's KV, whichever is
  slower, plus a fixed per-step overhead;
- :class:`MeasuredTimer`: from what an engine was measured to do (a ``kvtier run`` report's
  ``engine`` section, or a calibration profile): a fixed cost per step, a cost per token in the
  step, a causal-attention cost per new token × context, and a fixed cost per request outside
  the steps (the API server's handling, returning the first token).

Both also answer ``prefill_seconds(new, cached)`` (one request alone, chunked as the engine
chunks it), the ``ComputeModel`` the load-or-recompute decision compares loads against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvtier.cost.calibration import DecodeFit, PrefillFit
from kvtier.cost.compute import RooflineCompute
from kvtier.errors import ConfigError

#: The engine's token budget per step unless told: vLLM's OpenAI server's on its CPU backend.
VLLM_CPU_BATCHED_TOKENS = 2048


class StepTimer(Protocol):
    """Seconds of one engine step, and the fixed cost of a request outside the steps."""

    request_overhead_s: float

    def step_seconds(
        self, prefill: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        """One step: ``prefill`` (new tokens, cached tokens before them) chunks and decodes."""
        ...

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        """One request's prefill alone, in steps of at most the engine's token budget."""
        ...


def _chunked(timer: StepTimer, budget: int, new: int, cached: int) -> float:
    total, done = 0.0, 0
    while done < new:
        n = min(budget, new - done)
        total += timer.step_seconds([(n, cached + done)], ())
        done += n
    return total


@dataclass(frozen=True)
class MeasuredTimer:
    """A step costs ``step_s + chunk_s·P + token_s·T + attention_s·Σn·(c + n/2) + context_s·ΣL
    + seq_s·(S−1)``.

    T is every token the step runs (prefill chunks plus one per decode), the attention term is
    summed over prefill chunks of n new tokens after c cached ones, L over the decodes'
    contexts, S − 1 the sequences in the step beyond the first (each costs its sampling and
    output handling; the first one's are in ``step_s``, a one-sequence decode step), P the
    prefill chunks (each a forward of a new shape: on a CPU its kernels are set up again).
    ``request_overhead_s`` is paid once per request before it reaches the scheduler.
    ``budget`` is the engine's token budget per step (vLLM's ``max_num_batched_tokens``), used
    by :meth:`prefill_seconds`.
    """

    step_s: float
    token_s: float
    attention_s: float = 0.0
    context_s: float = 0.0
    request_overhead_s: float = 0.0
    budget: int = VLLM_CPU_BATCHED_TOKENS
    seq_s: float = 0.0
    chunk_s: float = 0.0

    def __post_init__(self) -> None:
        names = (
            "step_s", "token_s", "attention_s", "context_s", "request_overhead_s", "seq_s",
            "chunk_s",
        )  # fmt: skip
        for name in names:
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"measured timer: {name} must be finite and >= 0, got {value}")
        if self.budget < 1:
            raise ConfigError("measured timer: the token budget must be at least 1")

    def step_seconds(
        self, prefill: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        if not prefill and not decode_contexts:
            return 0.0
        tokens = sum(n for n, _ in prefill) + len(decode_contexts)
        attention = sum(n * (c + n / 2) for n, c in prefill)
        return (
            self.step_s
            + self.token_s * tokens
            + self.attention_s * attention
            + self.context_s * sum(decode_contexts)
            + self.seq_s * max(len(prefill) + len(decode_contexts) - 1, 0)
            + self.chunk_s * sum(1 for n, _ in prefill if n > 1)
        )

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        return _chunked(self, self.budget, new, cached)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {"kind": "measured", **self.__dict__}


@dataclass(frozen=True)
class RooflineTimer:
    """A step from specs: max(compute time of its FLOPs, HBM time of weights + KV) + overhead.

    Prefill chunks cost their linear and attention FLOPs (as ``RooflineCompute.prefill_flops``
    counts them); each decode one token's FLOPs and its context's KV read; the weights are read
    once per step. The model's constants are taken once, so a step costs a few multiplications.
    """

    compute: RooflineCompute
    step_overhead_s: float = 0.0
    request_overhead_s: float = 0.0
    budget: int = 8192

    def __post_init__(self) -> None:
        c = self.compute
        m = c.model
        qk, v = m.attention_dims()
        fps = c.flops_per_second
        hbm = c.gpu.hbm_bandwidth * c.mbu
        # seconds per linear token, per attention pair (new token × context token)
        object.__setattr__(self, "_linear_s", 2.0 * m.params_per_token / fps)
        object.__setattr__(self, "_pair_s", 2.0 * m.layers * m.attention_heads * (qk + v) / fps)
        object.__setattr__(self, "_weights_s", c.decode_step_bytes(0, 0) / hbm)
        object.__setattr__(self, "_kv_s", m.kv_bytes_per_token(c.tp) / hbm)

    def step_seconds(
        self, prefill: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        if not prefill and not decode_contexts:
            return 0.0
        tokens = len(decode_contexts)
        pairs = float(sum(decode_contexts)) + tokens
        kv = float(sum(decode_contexts))
        for n, k in prefill:
            tokens += n
            pairs += n * (k + (n + 1) / 2)
            kv += k
        compute = tokens * self._linear_s + pairs * self._pair_s  # type: ignore[attr-defined]
        memory = self._weights_s + kv * self._kv_s  # type: ignore[attr-defined]
        return max(compute, memory) + self.step_overhead_s

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        linear, pair = self._linear_s, self._pair_s  # type: ignore[attr-defined]
        weights, kv = self._weights_s, self._kv_s  # type: ignore[attr-defined]
        total, done, budget = 0.0, 0, self.budget
        while done < new:
            n = min(budget, new - done)
            k = cached + done
            compute = n * linear + n * (k + (n + 1) / 2) * pair
            total += max(compute, weights + k * kv) + self.step_overhead_s
            done += n
        return total

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        c = self.compute
        return {
            "kind": "roofline",
            "model": c.model.name,
            "gpu": c.gpu.name,
            "tp": c.tp,
            "mfu": c.mfu,
            "mbu": c.mbu,
            "step_overhead_s": self.step_overhead_s,
            "request_overhead_s": self.request_overhead_s,
            "budget": self.budget,
        }


@dataclass(frozen=True)
class ProfileTimer:
    """A step from a ``kvtier calibrate`` profile: each prefill chunk costs what the profile's
    prefill fit says for it, the decodes one decode step of their batch at their mean context.

    The profile is measured one forward at a time (the HF engine), so a step that mixes a
    prefill chunk with decodes is the sum of the two.
    """

    prefill: PrefillFit
    decode: DecodeFit | None = None
    request_overhead_s: float = 0.0
    budget: int = VLLM_CPU_BATCHED_TOKENS

    def step_seconds(
        self, prefill: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        total = sum(self.prefill.seconds(n, c) for n, c in prefill if n > 0)
        if decode_contexts:
            batch = len(decode_contexts)
            context = sum(decode_contexts) // batch
            if self.decode is not None:
                total += self.decode.seconds(context, batch)
            else:
                total += self.prefill.seconds(batch, context)
        return total

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        return _chunked(self, self.budget, new, cached)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        p, d = self.prefill, self.decode
        return {
            "kind": "profile",
            "prefill": {"a": p.a, "b": p.b, "c": p.c, "d": p.d, "e": p.e},
            "decode": None if d is None else {"a": d.a, "b": d.b, "c": d.c},
            "request_overhead_s": self.request_overhead_s,
            "budget": self.budget,
        }


__all__ = ["MeasuredTimer", "ProfileTimer", "RooflineTimer", "StepTimer"]
