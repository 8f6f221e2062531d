"""Figures of a simulation whose step times jitter: pooled over several seeded replays.

With a jittering host (:class:`~kvtier.sim.config.FrontendSpec` ``jitter``) one replay's p95
hangs on a few draws, as one real run's does. The figures a comparison or a fit needs are
taken over ``REPLAYS`` replays with consecutive seeds instead: percentiles over all their
requests, preemptions as their mean. Without jitter one replay is all there is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvtier.sim.config import SimConfig
from kvtier.sim.results import SimResult, percentiles
from kvtier.workloads.requests import TraceRequest

#: Replays pooled when the steps jitter.
REPLAYS = 8


@dataclass(frozen=True)
class Pooled:
    """TTFT and end-to-end percentiles and mean preemptions over the replays; the first
    replay's full result (its records and summary) beside them."""

    ttft_s: dict[str, float | None]
    e2e_s: dict[str, float | None]
    preemptions: float
    replays: int
    first: SimResult


def jitters(config: SimConfig) -> bool:
    """Whether the configuration's steps take random times."""
    return config.frontend is not None and config.frontend.jitter > 0


def replay(config: SimConfig, requests: Sequence[TraceRequest], replays: int = REPLAYS) -> Pooled:
    """Simulate ``requests`` once, or ``replays`` times (seeds ``config.seed`` onwards) when
    the steps jitter, and pool the figures."""
    from kvtier.sim.simulator import simulate

    count = replays if jitters(config) else 1
    results = [simulate(replace(config, seed=config.seed + k), requests) for k in range(count)]
    if count == 1:
        summary = results[0].summary
        return Pooled(summary["ttft_s"], summary["e2e_s"], summary["preemptions"], 1, results[0])
    ttft = [r.ttft_s for res in results for r in res.records if r.ttft_s is not None]
    e2e = [r.e2e_s for res in results for r in res.records if r.e2e_s is not None]
    preempt = sum(res.summary["preemptions"] for res in results) / count
    return Pooled(percentiles(ttft), percentiles(e2e), preempt, count, results[0])


__all__ = ["REPLAYS", "Pooled", "jitters", "replay"]
