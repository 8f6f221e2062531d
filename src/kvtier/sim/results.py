"""What a simulation reports: one record per request and a summary of the run.

Per request: when it was due and sent, its wait in the engine's queue, its wait for KV loads,
time to first token (from the send), time per output token, end to end, hit tokens per tier
(``engine``: the engine's own prefix cache), computed and recomputed tokens, preemptions.
The summary: TTFT/TPOT/E2E percentiles, throughput and goodput under the SLO, each replica's
time split into computing / waiting for KV / idle, hit rates per tier, bytes and utilisation
per link, and NVMe writes per day against the drive's rating.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvtier.sim.config import SimConfig
from kvtier.sim.links import LinkQueue
from kvtier.sim.replica import Replica
from kvtier.sim.request import SimRequest
from kvtier.sim.tiers import SimTier
from kvtier.specs.jsonout import finite

_DAY = 86_400.0


@dataclass
class RequestRecord:
    """One request's figures (seconds from the start of the workload, or durations)."""

    rid: int
    session: str | None
    turn: int
    kind: str
    replica: int
    due_s: float
    sent_s: float
    queue_wait_s: float
    load_wait_s: float
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    prompt_tokens: int
    output_tokens: int
    hit_tokens: dict[str, int]
    computed_tokens: int
    recomputed_tokens: int
    preemptions: int
    decision: str


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50/p95/p99 and mean (None when there is nothing)."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    arr = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(arr.mean())}


@dataclass
class SimResult:
    """The records and the summary (``to_dict`` for ``--json``; ``records_csv`` for CSV), and
    the simulation's own cost (``run``: wall seconds, events)."""

    records: list[RequestRecord]
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, records: bool = True) -> dict[str, Any]:
        """Plain JSON-ready data (no infinities). ``run`` holds how long the simulation itself
        took on this machine (the only figure that differs between two equal runs)."""
        out: dict[str, Any] = {"config": self.config, "summary": self.summary, "run": self.run}
        if records:
            out["requests"] = [asdict(r) for r in self.records]
        return finite(out)

    def records_csv(self) -> str:
        """The per-request records as CSV (hit tokens as ``hit_<tier>`` columns)."""
        tiers = sorted({t for r in self.records for t in r.hit_tokens})
        buf = io.StringIO()
        names = [f for f in RequestRecord.__dataclass_fields__ if f != "hit_tokens"]
        writer = csv.writer(buf)
        writer.writerow(names + [f"hit_{t}" for t in tiers])
        for r in self.records:
            row = asdict(r)
            writer.writerow([row[n] for n in names] + [r.hit_tokens.get(t, 0) for t in tiers])
        return buf.getvalue()


def _record(r) -> RequestRecord:
    ttft = None if r.first_token_s is None else r.first_token_s - r.sent_s
    e2e = None if r.finish_s is None else r.finish_s - r.sent_s
    tpot = None
    if r.finish_s is not None and r.first_token_s is not None and r.output > 1:
        tpot = (r.finish_s - r.first_token_s) / (r.output - 1)
    start = r.first_scheduled_s if r.first_scheduled_s is not None else r.arrived_s
    return RequestRecord(
        rid=r.rid,
        session=r.trace.session,
        turn=r.trace.turn,
        kind=r.trace.kind,
        replica=r.replica,
        due_s=r.due_s,
        sent_s=r.sent_s,
        queue_wait_s=max(0.0, start - r.arrived_s),
        load_wait_s=r.load_wait_s,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        prompt_tokens=r.prompt,
        output_tokens=r.generated,
        hit_tokens=dict(r.hit_tokens),
        computed_tokens=r.computed_tokens,
        recomputed_tokens=r.recomputed_tokens,
        preemptions=r.preemptions,
        decision=r.decision,
    )


def build_result(
    cfg: SimConfig,
    requests: Sequence[SimRequest],
    now: float,
    engines: Sequence[Replica],
    link_queues: Mapping[str, LinkQueue],
    tier_rows: Sequence[Sequence[SimTier]],
) -> SimResult:
    """Records and summary of a finished simulation: its config, requests, clock, replicas
    (``engines``), links and tiers (one row of tiers per replica)."""
    records = [_record(r) for r in requests]
    done = [r for r in records if r.e2e_s is not None]
    first = min((r.sent_s for r in records), default=0.0)
    makespan = max(now - first, 1e-12)
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [r.tpot_s for r in done if r.tpot_s is not None]
    e2e = [r.e2e_s for r in done if r.e2e_s is not None]
    good = [
        r
        for r in done
        if (r.ttft_s or 0) <= cfg.slo_ttft_s and (r.tpot_s is None or r.tpot_s <= cfg.slo_tpot_s)
    ]
    prompt_tokens = sum(r.prompt_tokens for r in done)
    hits: dict[str, int] = {}
    for r in records:
        for tier, n in r.hit_tokens.items():
            hits[tier] = hits.get(tier, 0) + n
    replicas = []
    totals = {"compute_s": 0.0, "kv_wait_s": 0.0, "idle_s": 0.0}
    for rep in engines:
        st = rep.stats
        span = st.compute_s + st.kv_wait_s + st.idle_s
        replicas.append(
            {
                "replica": rep.index,
                "steps": st.steps,
                "compute_s": st.compute_s,
                "kv_wait_s": st.kv_wait_s,
                "idle_s": st.idle_s,
                "compute_share": st.compute_s / span if span else 0.0,
                "kv_wait_share": st.kv_wait_s / span if span else 0.0,
                "idle_share": st.idle_s / span if span else 0.0,
                "preemptions": st.preemptions,
                "prefill_tokens": st.prefill_tokens,
                "decode_tokens": st.decode_tokens,
                "peak_running": st.peak_running,
                "peak_waiting": st.peak_waiting,
                "prefix_cache_evictions": rep.pool.evicted,
                "decisions": dict(rep.connector.decisions) if rep.connector else {},
                "preloaded_chunks": rep.connector.preloaded_chunks if rep.connector else 0,
            }
        )
        for k in totals:
            totals[k] += getattr(st, k)
    span = sum(totals.values())
    links = {
        name: {
            "bytes": link.use.bytes_moved,
            "busy_s": link.use.busy_s,
            "utilization": link.use.busy_s / makespan,
            "transfers": link.use.transfers,
        }
        for name, link in sorted(link_queues.items())
    }
    tiers = {}
    seen: set[int] = set()
    for row in tier_rows:
        for tier in row:
            if id(tier) in seen:
                continue
            seen.add(id(tier))
            usage = tier.ledger.usage()
            capacity = tier.spec.capacity_bytes
            per_day = tier.written_bytes / makespan * _DAY
            tiers[tier.medium.name] = {
                "tier": tier.name,
                "stored_blocks": tier.stored_blocks,
                "held_blocks": usage.blocks,
                "held_bytes": usage.used,
                "capacity_bytes": capacity,
                "written_bytes": tier.written_bytes,
                "read_bytes": tier.read_bytes,
                "evicted_blocks": tier.evicted,
                "refused_blocks": tier.refused,
                "writes_per_day_bytes": per_day,
                "drive_writes_per_day": per_day / capacity if capacity else None,
                "rated_dwpd": tier.spec.dwpd,
            }
    out_tokens = sum(r.output_tokens for r in done)
    summary = {
        "requests": len(records),
        "finished": len(done),
        "rejected": sum(1 for r in requests if r.state == "rejected"),
        "duration_s": makespan,
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "e2e_s": percentiles(e2e),
        "queue_wait_s": percentiles([r.queue_wait_s for r in done]),
        "load_wait_s": percentiles([r.load_wait_s for r in done]),
        "throughput": {
            "requests_per_s": len(done) / makespan,
            "output_tokens_per_s": out_tokens / makespan,
            "prompt_tokens_per_s": sum(r.prompt_tokens for r in done) / makespan,
        },
        "goodput": {
            "slo_ttft_s": cfg.slo_ttft_s,
            "slo_tpot_s": cfg.slo_tpot_s,
            "requests_per_s": len(good) / makespan,
            "share": len(good) / len(done) if done else 0.0,
        },
        "gpu_time": {
            "compute_share": totals["compute_s"] / span if span else 0.0,
            "kv_wait_share": totals["kv_wait_s"] / span if span else 0.0,
            "idle_share": totals["idle_s"] / span if span else 0.0,
            **totals,
        },
        "prompt_tokens": prompt_tokens,
        "hit_tokens": hits,
        "hit_rate": {t: n / prompt_tokens for t, n in hits.items()} if prompt_tokens else {},
        "computed_tokens": sum(r.computed_tokens for r in records),
        "recomputed_tokens": sum(r.recomputed_tokens for r in records),
        "preemptions": sum(r.preemptions for r in records),
        "replicas": replicas,
        "links": links,
        "tiers": tiers,
    }
    return SimResult(records, summary)


__all__ = ["RequestRecord", "SimResult", "build_result", "percentiles"]
