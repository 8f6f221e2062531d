"""What the vLLM job reports: every request of both phases, per-system figures, table and JSON.

Each phase (vLLM alone, vLLM with kvtier's connector) keeps its measured requests
(:class:`RequestRecord`), its ``/metrics`` delta and the engine's warm-up timings.
:func:`summarize_phase` derives every figure of the table from those records, so the table and
the JSON agree: hit tokens per tier add up to the prompt tokens not computed, and the prefill
seconds saved are the engine's measured prefill curve applied to those hits.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from kvtier.job.report import attribute_dict, format_seconds, percentile, report_json

SCHEMA = "kvtier.run.vllm/1"
#: The engine's own prefix cache in a record's ``hit_tokens`` (the others are kvtier's tiers).
ENGINE_TIER = "vllm"
SYSTEMS = ("vllm", "vllm+kvtier", "vllm+kvtier+codec")
#: A phase's fields its JSON carries as they are, before its metrics and requests.
PHASE_FIELDS = ("system", "startup_s", "warmup", "wall_s", "server", "tiers", "notes", "errors")
#: The report's fields its JSON carries as they are, between its summary and its phases.
REPORT_FIELDS = (
    "machine",
    "model",
    "engine",
    "sizing",
    "tiers",
    "config",
    "notes",
    "failed",
    "wall_s",
)


@dataclass
class RequestRecord:
    """One request as the client measured it, with what the engine and kvtier held for it.

    Times are seconds; ``due_s``/``sent_s`` count from the phase's start (due: when the session
    wanted to send it; sent: when a concurrency slot let it go). ``hit_tokens`` maps a tier
    (``vllm`` for the engine's own prefix cache, then kvtier's tiers) to prompt tokens found
    there when the request was scheduled, ``unloaded_tokens`` those of kvtier's that then failed
    to load (vLLM computed them); ``load_wait_s`` is how long the engine waited for kvtier's KV
    (None without it).
    ``block_hashes`` are the prompt's chained keys (hex, one per full block of vLLM's
    ``record_block_tokens`` in the report's config), so a replay finds the prefixes vLLM's
    own cache could share.
    """

    session: str
    kind: str
    turn: int
    due_s: float
    sent_s: float
    prompt_tokens: int
    prompt_hash: str
    block_hashes: list[str]
    max_tokens: int
    output_tokens: int
    output_hash: str
    ttft_s: float
    e2e_s: float
    cached_tokens: int | None
    hit_tokens: dict[str, int] = field(default_factory=dict)
    load_wait_s: float | None = None
    server: dict[str, float] = field(default_factory=dict)
    connector: dict[str, Any] | None = None
    unloaded_tokens: int = 0  # of the tiers' hits, those that failed to load (vLLM computed them)

    @property
    def hits(self) -> int:
        """Prompt tokens not computed (every tier; a hit that failed to load was computed)."""
        return sum(self.hit_tokens.values()) - self.unloaded_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PhaseResult:
    """One system's phase: its server start, warm-up, requests and metrics."""

    system: str
    startup_s: float
    warmup: dict[str, Any]
    wall_s: float
    requests: list[RequestRecord]
    errors: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_after: dict[str, float] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tiers: dict[str, Any] = field(default_factory=dict)  # kvtier's tier URLs and what they held

    def to_dict(self) -> dict[str, Any]:
        return {
            **attribute_dict(self, PHASE_FIELDS),
            "metrics_delta": self.metrics,
            "kvtier_metrics": {
                k: v for k, v in self.metrics_after.items() if k.startswith("kvtier")
            },
            "requests": [r.to_dict() for r in self.requests],
        }


def _metric(metrics: dict[str, float], name: str) -> float | None:
    total = [v for k, v in metrics.items() if k == name or k.startswith(name + "{")]
    return sum(total) if total else None


def summarize_phase(phase: PhaseResult, saved_s) -> dict[str, Any]:
    """The figures of one phase. ``saved_s(hit_tokens)`` → prefill seconds those hits save."""
    reqs = phase.requests
    ttft = [r.ttft_s for r in reqs]
    e2e = [r.e2e_s for r in reqs]
    prompt = sum(r.prompt_tokens for r in reqs)
    output = sum(r.output_tokens for r in reqs)
    tiers: dict[str, int] = {}
    for r in reqs:
        for tier, n in r.hit_tokens.items():
            tiers[tier] = tiers.get(tier, 0) + int(n)
    unloaded = sum(r.unloaded_tokens for r in reqs)
    hits = sum(r.hits for r in reqs)
    waits = [r.load_wait_s for r in reqs if r.load_wait_s is not None]
    wall = phase.wall_s
    m = phase.metrics
    return {
        "system": phase.system,
        "requests": len(reqs),
        "errors": len(phase.errors),
        "wall_s": wall,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p95_s": percentile(e2e, 95),
        "output_tokens_per_s": output / wall if wall > 0 else None,
        "requests_per_s": len(reqs) / wall if wall > 0 else None,
        "hit_tokens": tiers,
        "unloaded_tokens": unloaded,
        "hit_fraction": hits / prompt if prompt else None,
        "computed_tokens": prompt - hits,
        "prefill_saved_s": sum(saved_s(r.hits) for r in reqs),
        "load_wait_s": sum(waits) if waits else (0.0 if phase.system == "vllm" else None),
        "engine_prefill_s": _metric(m, "vllm:request_prefill_time_seconds_sum"),
        "engine_queue_s": _metric(m, "vllm:request_queue_time_seconds_sum"),
        "engine_prefix_hits": _metric(m, "vllm:prefix_cache_hits_total"),
        "engine_external_hits": _metric(m, "vllm:external_prefix_cache_hits_total"),
        "preemptions": _metric(m, "vllm:num_preemptions_total"),
        "held_tokens": {t: h["tokens"] for t, h in phase.tiers.get("held", {}).items()},
        "held_bytes": {t: h["stored_bytes"] for t, h in phase.tiers.get("held", {}).items()},
    }


def same_answers(a: PhaseResult, b: PhaseResult) -> dict[str, int]:
    """How many requests (by session and turn) got the same answer in both phases."""
    left = {(r.session, r.turn): r.output_hash for r in a.requests}
    both = [
        (left[(r.session, r.turn)], r.output_hash)
        for r in b.requests
        if (r.session, r.turn) in left
    ]
    return {"compared": len(both), "same": sum(x == y for x, y in both)}


@dataclass
class VllmRunReport:
    """Everything one ``kvtier run --engine vllm`` measured."""

    machine: dict[str, Any]
    model: dict[str, Any]
    config: dict[str, Any]
    engine: dict[str, Any]  # the measured prefill curve and decode step (EngineSpeed.to_dict)
    sizing: dict[str, Any]
    phases: list[PhaseResult]
    tiers: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def _saved(self, hits: int) -> float:
        """Prefill seconds ``hits`` cached tokens save, on the engine's measured curve."""
        p = self.engine.get("prefill", {})
        return p.get("b_s_per_token", 0.0) * hits + p.get("c_s_per_token2", 0.0) * hits * hits

    def summary(self) -> dict[str, Any]:
        """Per-system figures and, with both phases, kvtier's change against vLLM alone."""
        systems = {p.system: summarize_phase(p, self._saved) for p in self.phases}
        out: dict[str, Any] = {"systems": systems, "wall_s": self.wall_s}
        base, kv = systems.get("vllm"), systems.get("vllm+kvtier")
        if base and kv:
            out["compare"] = {
                "ttft_p50_ratio": _ratio(base["ttft_p50_s"], kv["ttft_p50_s"]),
                "ttft_p95_ratio": _ratio(base["ttft_p95_s"], kv["ttft_p95_s"]),
                "computed_tokens_ratio": _ratio(base["computed_tokens"], kv["computed_tokens"]),
                "answers": same_answers(self.phases[0], self.phases[1]),
            }
        coded = systems.get("vllm+kvtier+codec")
        if kv and coded:
            out["codec"] = codec_compare(kv, coded)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "summary": self.summary(),
            **attribute_dict(self, REPORT_FIELDS),
            "phases": [p.to_dict() for p in self.phases],
        }

    def to_json(self) -> str:
        return report_json(self.to_dict())


def codec_compare(raw: dict[str, Any], coded: dict[str, Any]) -> dict[str, Any]:
    """The disk codec's effect (two kvtier phases' summaries, its disk raw then coded): tokens
    the same disk tier held, the hit fraction and TTFT each got."""
    raw_disk, coded_disk = raw["held_tokens"].get("disk"), coded["held_tokens"].get("disk")
    return {
        "disk_tokens_held": {"raw": raw_disk, "kv": coded_disk},
        "disk_tokens_held_ratio": _ratio(coded_disk, raw_disk),
        "hit_fraction": {"raw": raw["hit_fraction"], "kv": coded["hit_fraction"]},
        "disk_hit_tokens": {
            "raw": raw["hit_tokens"].get("disk", 0),
            "kv": coded["hit_tokens"].get("disk", 0),
        },
        "ttft_p50_ratio": _ratio(raw["ttft_p50_s"], coded["ttft_p50_s"]),
        "ttft_p95_ratio": _ratio(raw["ttft_p95_s"], coded["ttft_p95_s"]),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b (how many times ``b`` is below ``a``); None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


_s = partial(format_seconds, ms_digits=0)


def _n(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render(report: VllmRunReport, console: Any) -> None:
    """Print the report as a rich table per system (columns) on ``console``."""
    from rich.table import Table

    s = report.summary()
    systems = s["systems"]
    m, sz, eng = report.model, report.sizing, report.engine
    pre = eng.get("prefill", {})
    console.print(
        f"[bold]kvtier run[/] (vLLM): {m.get('model_id')} {m.get('dtype')} on "
        f"{report.machine.get('cpu')}, {report.machine.get('cpus')} cores; KV pool "
        f"{report.config.get('pool_blocks')} blocks × 128 tokens; concurrency "
        f"{report.config.get('concurrency')}"
    )
    console.print(
        f"workload: {sz.get('requests')} requests, {sz.get('prompt_tokens')} prompt tokens, "
        f"working set {sz.get('working_set_tokens')} tokens (scale {sz.get('scale')}, "
        f"estimated {_n(sz.get('estimate_s'), 0)} s per phase, budget "
        f"{_n(sz.get('phase_budget_s'), 0)} s); engine prefill "
        f"{_n(eng.get('prefill_tokens_per_s'), 0)} tokens/s at "
        f"{eng.get('prefill_reference_tokens')} tokens, decode step "
        f"{_s(eng.get('decode_step_s'))}; cold TTFT = {_n(pre.get('a_s'), 3)} s + "
        f"{_n((pre.get('b_s_per_token') or 0) * 1e3, 3)} ms/token"
    )
    if report.tiers:
        console.print(
            "kvtier tiers: "
            + " → ".join(f"{t['name']} {t['size']}" for t in report.tiers.get("tiers", []))
        )
    names = [n for n in SYSTEMS if n in systems]
    tiers = sorted({t for n in names for t in systems[n]["hit_tokens"]}, key=_tier_order)
    table = Table(title="vLLM alone vs vLLM + kvtier (same KV pool, same workload)")
    table.add_column("")
    for n in names:
        table.add_column(n, justify="right")
    rows: list[tuple[str, Any]] = [
        ("requests (errors)", lambda x: f"{x['requests']} ({x['errors']})"),
        ("TTFT p50", lambda x: _s(x["ttft_p50_s"])),
        ("TTFT p95", lambda x: _s(x["ttft_p95_s"])),
        ("end-to-end p50", lambda x: _s(x["e2e_p50_s"])),
        ("output tokens/s", lambda x: _n(x["output_tokens_per_s"], 1)),
        ("requests/s", lambda x: _n(x["requests_per_s"], 3)),
        ("prompt tokens", lambda x: str(x["prompt_tokens"])),
    ]
    for tier in tiers:
        label = "hit tokens: vLLM pool" if tier == ENGINE_TIER else f"hit tokens: kvtier {tier}"
        rows.append((label, lambda x, t=tier: str(x["hit_tokens"].get(t, 0))))
    held = sorted({t for n in names for t in systems[n]["held_tokens"]}, key=_tier_order)
    for tier in held:
        rows.append(
            (f"tokens held at the end: {tier}", lambda x, t=tier: _held(x, t)),
        )
    rows += [
        ("kvtier hits that failed to load", lambda x: str(x.get("unloaded_tokens", 0))),
        ("prompt tokens computed", lambda x: str(x["computed_tokens"])),
        ("prefill seconds saved", lambda x: _n(x["prefill_saved_s"], 1)),
        ("engine time waiting for KV", lambda x: _s(x["load_wait_s"])),
        ("engine prefill time (metrics)", lambda x: _s(x["engine_prefill_s"])),
        ("phase wall time", lambda x: _s(x["wall_s"])),
    ]
    for label, fmt in rows:
        table.add_row(label, *(fmt(systems[n]) for n in names))
    console.print(table)
    cmp = s.get("compare")
    if cmp:
        ans = cmp["answers"]
        console.print(
            f"vLLM alone ÷ vLLM + kvtier (above 1: kvtier better): TTFT p50 "
            f"{_n(cmp['ttft_p50_ratio'])}×, p95 {_n(cmp['ttft_p95_ratio'])}×, prompt tokens "
            f"computed {_n(cmp['computed_tokens_ratio'])}×; same answers on "
            f"{ans['same']}/{ans['compared']} requests"
        )
    codec = s.get("codec")
    if codec:
        held_tokens, hit = codec["disk_tokens_held"], codec["hit_fraction"]
        console.print(
            f"disk codec kv ÷ raw (same disk tier size): tokens held "
            f"{_n(codec['disk_tokens_held_ratio'])}× ({held_tokens['kv']} vs "
            f"{held_tokens['raw']}); hit fraction {_n(hit['kv'], 3)} vs {_n(hit['raw'], 3)}; "
            f"TTFT p50 {_n(codec['ttft_p50_ratio'])}×, p95 {_n(codec['ttft_p95_ratio'])}× "
            "(above 1: the codec better)"
        )
    for note in report.notes:
        console.print(f"[yellow]note[/]: {note}")
    for failure in report.failed:
        console.print(f"[red]failed[/]: {failure.splitlines()[0]}")
    console.print(f"run took {report.wall_s:.0f} s")


def _held(summary: dict[str, Any], tier: str) -> str:
    tokens = summary["held_tokens"].get(tier)
    if tokens is None:
        return "–"
    stored = summary["held_bytes"].get(tier, 0)
    return f"{tokens} ({stored / (1 << 20):.0f} MiB)"


def _tier_order(name: str) -> tuple[int, str]:
    order = {ENGINE_TIER: 0, "dram": 1, "disk": 2}
    return order.get(name, 3), name


__all__ = [
    "ENGINE_TIER",
    "SCHEMA",
    "SYSTEMS",
    "PhaseResult",
    "RequestRecord",
    "VllmRunReport",
    "codec_compare",
    "percentile",
    "render",
    "same_answers",
    "summarize_phase",
]
