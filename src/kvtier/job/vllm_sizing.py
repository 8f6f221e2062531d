"""Sizing the vLLM job: the engine's measured speed, a phase's expected duration, and the largest
workload (and KV pool and tiers) that fits the run's time budget.

The engine's prefill curve is fitted on cold requests timed at the start (time to first token
against prompt length, :class:`PrefillCurve`); a phase is estimated pessimistically, as if every
prompt were computed but the shared system prompt. The workload shrinks (:func:`scaled`) until
the estimate fits, never below the size whose working set is ``min_ws_ratio`` times the engine's
KV pool, so that vLLM's pool and kvtier's host-memory tier both evict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvtier.errors import ConfigError
from kvtier.keys import ChunkKeyer, Namespace
from kvtier.workloads.longctx import LongContextSpec, Step, build_sessions, dry_run, scaled


@dataclass(frozen=True)
class PrefillCurve:
    """Seconds to first token of a cold prompt of ``n`` tokens: ``a + b·n + c·n²``.

    ``a`` is the engine's fixed cost per request (scheduling, one forward's overhead, the first
    sampled token); ``b·n + c·n²`` the prefill work, so a cached prefix of ``h`` tokens saves
    about ``b·h + c·h²`` (:meth:`saved_s`).
    """

    a: float
    b: float
    c: float = 0.0
    points: tuple[tuple[int, float], ...] = ()

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]]) -> PrefillCurve:
        """Least squares over (tokens, seconds), with ``c`` ≥ 0 (a line when it would not be)."""
        pts = tuple((int(n), float(s)) for n, s in points)
        if len({n for n, _ in pts}) < 2:
            raise ConfigError("a prefill curve needs timings at two prompt lengths at least")
        n = np.array([p[0] for p in pts], dtype=float)
        s = np.array([p[1] for p in pts], dtype=float)
        if len({int(x) for x in n}) >= 3:
            c, b, a = np.polyfit(n, s, 2)
            if c >= 0 and b >= 0:
                return cls(max(float(a), 0.0), float(b), float(c), pts)
        b, a = np.polyfit(n, s, 1)
        return cls(max(float(a), 0.0), max(float(b), 1e-9), 0.0, pts)

    def seconds(self, tokens: int) -> float:
        """Time to first token of a cold prompt of ``tokens`` tokens."""
        return self.a + self.b * tokens + self.c * tokens * tokens

    def saved_s(self, hit_tokens: int) -> float:
        """Prefill seconds a cached prefix of ``hit_tokens`` tokens saves."""
        return self.b * hit_tokens + self.c * hit_tokens * hit_tokens

    def tokens_per_s(self, tokens: int) -> float:
        """Prefill speed (prompt tokens per second) at a prompt of ``tokens`` tokens."""
        return tokens / max(self.seconds(tokens), 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a_s": self.a,
            "b_s_per_token": self.b,
            "c_s_per_token2": self.c,
            "points": [list(p) for p in self.points],
        }


@dataclass(frozen=True)
class EngineSpeed:
    """What the engine was measured to do: its prefill curve and one decode step's seconds."""

    prefill: PrefillCurve
    decode_step_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": self.prefill.to_dict(), "decode_step_s": self.decode_step_s}


@dataclass(frozen=True)
class TimeBudget:
    """The whole run's time budget and what is spent outside the two phases.

    ``spent_s``: already gone (the first server's start and the warm-up); ``next_start_s``: the
    second server's start and warm-up still to come; ``kvtier_factor``: the kvtier phase's
    expected length relative to the vLLM-alone one (at most as long: it computes less).
    """

    total_s: float = 300.0
    spent_s: float = 0.0
    next_start_s: float = 45.0
    margin_s: float = 15.0
    kvtier_factor: float = 1.0

    @property
    def phase_s(self) -> float:
        """Seconds one vLLM-alone phase may take."""
        left = self.total_s - self.spent_s - self.next_start_s - self.margin_s
        return max(left, 0.0) / (1.0 + self.kvtier_factor)


def workload_steps(spec: LongContextSpec) -> list[Step]:
    """The workload's requests, answered with placeholders (lengths as the real run's)."""
    return [step for _, step in dry_run(build_sessions(spec))]


def working_set_tokens(steps: Sequence[Step], block_tokens: int) -> int:
    """Distinct KV the prompts need, in tokens: full ``block_tokens`` blocks by chained key."""
    keyer = ChunkKeyer(Namespace("workload", "sizing", "none", 1, 1, 1), block_tokens)
    seen: set[bytes] = set()
    for step in steps:
        seen.update(keyer.keys(step.prompt))
    return len(seen) * block_tokens


def estimate_phase_s(
    spec: LongContextSpec, steps: Sequence[Step], speed: EngineSpeed, concurrency: int
) -> float:
    """Pessimistic seconds of one phase: every prompt computed but the system prompt, answers
    decoded in batches of up to ``min(concurrency, 2)``; at least the longest session's chain of
    arrivals, pauses and requests."""
    curve = speed.prefill
    hot = spec.system_tokens
    per_request = [curve.seconds(len(s.prompt)) - curve.saved_s(hot) for s in steps]
    decode = [s.max_tokens * speed.decode_step_s for s in steps]
    busy = sum(per_request) + sum(decode) / max(1, min(concurrency, 2))
    chains: dict[str, float] = {}
    arrivals = {s.name: s.arrival_s for s in build_sessions(spec)}
    for step, p, d in zip(steps, per_request, decode, strict=True):
        chains[step.session] = chains.get(step.session, arrivals.get(step.session, 0.0))
        chains[step.session] += step.delay_s + p + d
    return max(busy, max(chains.values(), default=0.0))


@dataclass(frozen=True)
class Sizing:
    """The workload a run uses and why: its scale, estimate, budget and working set."""

    spec: LongContextSpec
    scale: float
    estimate_s: float
    phase_budget_s: float
    working_set_tokens: int
    pool_tokens: int
    requests: int
    prompt_tokens: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits(self) -> bool:
        return self.estimate_s <= self.phase_budget_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "estimate_s": self.estimate_s,
            "phase_budget_s": self.phase_budget_s,
            "fits": self.fits,
            "working_set_tokens": self.working_set_tokens,
            "pool_tokens": self.pool_tokens,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "spec": asdict(self.spec),
            "notes": list(self.notes),
        }


def size_workload(
    spec: LongContextSpec,
    speed: EngineSpeed,
    phase_budget_s: float,
    pool_tokens: int,
    concurrency: int,
    *,
    block_tokens: int = 128,
    min_ws_ratio: float = 2.0,
    iterations: int = 10,
) -> Sizing:
    """The largest scale of ``spec`` whose phase estimate fits ``phase_budget_s``, but never one
    whose working set is under ``min_ws_ratio × pool_tokens`` (nor prompts under 2k tokens)."""

    def measure(f: float) -> tuple[LongContextSpec, list[Step], float, int]:
        s = scaled(spec, f)
        steps = workload_steps(s)
        return (
            s,
            steps,
            estimate_phase_s(s, steps, speed, concurrency),
            working_set_tokens(steps, block_tokens),
        )

    notes: list[str] = []
    need_ws = min_ws_ratio * pool_tokens
    # The floor: the least scale whose working set still overflows the pool.
    lo, hi = 0.0, 1.0
    if measure(0.0)[3] < need_ws:
        if measure(1.0)[3] < need_ws:
            lo = 1.0
            notes.append(
                f"even the full workload's working set is under {min_ws_ratio:g}× the KV pool; "
                "give a smaller pool or a larger workload"
            )
        else:
            for _ in range(iterations):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if measure(mid)[3] >= need_ws else (mid, hi)
            lo = hi
    floor = lo
    best = measure(1.0)
    scale = 1.0
    if best[2] > phase_budget_s:
        low = measure(floor)
        if low[2] > phase_budget_s:
            best, scale = low, floor
            notes.append(
                f"the smallest workload kept ({low[2]:.0f} s estimated per phase) exceeds the "
                f"phase budget ({phase_budget_s:.0f} s): the run takes longer than asked"
            )
        else:
            a, b = floor, 1.0
            best, scale = low, floor
            for _ in range(iterations):
                mid = (a + b) / 2
                trial = measure(mid)
                if trial[2] <= phase_budget_s:
                    best, scale, a = trial, mid, mid
                else:
                    b = mid
    s, steps, estimate, ws = best
    return Sizing(
        spec=s,
        scale=round(scale, 4),
        estimate_s=round(estimate, 2),
        phase_budget_s=round(phase_budget_s, 2),
        working_set_tokens=ws,
        pool_tokens=pool_tokens,
        requests=len(steps),
        prompt_tokens=sum(len(st.prompt) for st in steps),
        notes=tuple(notes),
    )


def tier_bytes(
    working_set_tokens: int,
    kv_bytes_per_token: int,
    chunk_tokens: int,
    dram_fraction: float = 0.6,
    disk_factor: float = 2.0,
) -> tuple[int, int]:
    """(host-memory tier, disk tier) bytes: the first a fraction of the working set (so it
    spills to disk), the second large enough to keep all of it; whole MiB, at least 4 chunks."""
    if not 0 < dram_fraction < 1:
        raise ConfigError(
            f"the DRAM tier's fraction of the working set must be in (0, 1), got {dram_fraction}"
        )
    mib = 1 << 20
    chunk = chunk_tokens * kv_bytes_per_token
    ws = working_set_tokens * kv_bytes_per_token

    def whole_mib(n: float) -> int:
        return int(-(-max(n, 4 * chunk) // mib) * mib)

    return whole_mib(ws * dram_fraction), whole_mib(ws * disk_factor)


__all__ = [
    "EngineSpeed",
    "PrefillCurve",
    "Sizing",
    "TimeBudget",
    "estimate_phase_s",
    "size_workload",
    "tier_bytes",
    "working_set_tokens",
    "workload_steps",
]
