"""What `kvtier run` reports: per request, per tier, per decision; as a table and as JSON.

Every figure is derived from the measured records in :class:`RunReport` by :func:`summarize`,
so the table and the JSON agree, and the counts add up: requests = Σ decisions by action,
hit tokens = Σ per tier, loaded chunks = Σ per tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtier.job.decision import DecisionEntry
from kvtier.job.report import attribute_dict, median, report_json
from kvtier.job.report import format_seconds as _s

#: Predicted time counts as accurate within this relative error of the measured one.
PREDICTION_TOLERANCE = 0.20
SCHEMA = "kvtier.run/1"
#: A request's fields its JSON carries as they are, before its times.
REQUEST_FIELDS = (
    "index",
    "session",
    "kind",
    "turn",
    "prompt_tokens",
    "shared_tokens",
    "generated",
    "tokens_match",
    "logits_max_diff",
)
#: The report's fields its JSON carries as they are, after its schema and summary.
REPORT_FIELDS = (
    "model",
    "tiers",
    "profile",
    "break_even",
    "admission",
    "timing",
    "load_average",
    "config",
)


@dataclass
class RequestResult:
    """One request, run with kvtier and recompute-only on the same token ids."""

    index: int
    session: str
    kind: str
    turn: int
    prompt_tokens: int
    shared_tokens: int
    tokens_match: bool
    generated: int
    kvtier: dict[str, Any]
    recompute: dict[str, Any]
    decision: DecisionEntry
    store_flush_s: float = 0.0
    logits_max_diff: float = 0.0

    @property
    def kvtier_ttft_s(self) -> float:
        return float(self.kvtier["ttft_s"])

    @property
    def recompute_ttft_s(self) -> float:
        return float(self.recompute["ttft_s"])

    @property
    def saved_s(self) -> float:
        """Seconds of time to first token kvtier saved on this request (negative: it cost)."""
        return self.recompute_ttft_s - self.kvtier_ttft_s

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            **attribute_dict(self, REQUEST_FIELDS),
            "ttft_kvtier_s": self.kvtier_ttft_s,
            "ttft_recompute_s": self.recompute_ttft_s,
            **attribute_dict(self, ("saved_s", "store_flush_s", "kvtier", "recompute")),
            "decision": self.decision.as_dict(),
        }


@dataclass
class RunReport:
    """Everything one run measured; :meth:`summary` derives the headline figures."""

    config: dict[str, Any]
    model: dict[str, Any]
    tiers: list[dict[str, str]]
    profile: dict[str, Any]
    break_even: dict[str, dict[str, Any]]
    requests: list[RequestResult]
    cache: dict[str, Any]
    admission: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    load_average: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Headline figures (see :func:`summarize`)."""
        return summarize(self)

    def to_dict(self) -> dict[str, Any]:
        """The whole report, JSON-ready."""
        return {
            "schema": SCHEMA,
            "summary": self.summary(),
            **attribute_dict(self, REPORT_FIELDS),
            "requests": [r.as_dict() for r in self.requests],
            "cache": self.cache,
        }

    def to_json(self) -> str:
        """The report as one JSON document."""
        return report_json(self.to_dict())


def summarize(report: RunReport) -> dict[str, Any]:
    """Headline figures of a run.

    - ``ttft``: totals and medians with kvtier and recompute-only, speed-up of the totals,
      seconds saved (Σ recompute − kvtier TTFT);
    - ``tokens``: prompt tokens, tokens reused (loaded) and the share of prompt tokens reused;
    - ``tiers``: per tier, chunks/tokens the lookups found there (hit rate = share of all
      looked-up chunks), chunks loaded from it, bytes read and written, writes refused by
      admission, evictions;
    - ``decisions``: counts by action, how many of the measured ones chose the faster path,
      and the predicted-vs-actual error of the chosen path's time (load + prefill).
    """
    reqs = report.requests
    chunk = int(report.model.get("chunk_tokens", 0))
    kv_ttft = [r.kvtier_ttft_s for r in reqs]
    base_ttft = [r.recompute_ttft_s for r in reqs]
    prompt = sum(r.prompt_tokens for r in reqs)
    reused = sum(int(r.kvtier["reused_tokens"]) for r in reqs)
    tier_names = [t["name"] for t in report.tiers]
    cache_tiers = report.cache.get("tiers", {})
    lookup_chunks = int(report.cache.get("lookup_chunks", 0))
    tiers: dict[str, dict[str, Any]] = {}
    for name in tier_names:
        m = cache_tiers.get(name, {})
        loaded = sum(int(r.kvtier["per_tier"].get(name, 0)) for r in reqs)
        hits = int(m.get("hits", 0))
        tiers[name] = {
            "hit_chunks": hits,
            "hit_tokens": hits * chunk,
            "hit_rate": hits / lookup_chunks if lookup_chunks else 0.0,
            "loaded_chunks": loaded,
            "loaded_tokens": loaded * chunk,
            "bytes_read": int(m.get("bytes_read", 0)),
            "bytes_written": int(m.get("bytes_written", 0)),
            "writes": int(m.get("writes", 0)),
            "not_admitted": int(m.get("not_admitted", 0)),
            "evictions": int(m.get("evictions", 0)),
            "promotions": int(m.get("promotions", 0)),
            "dropped_writes": int(m.get("dropped_writes", 0)),
        }
    entries = [r.decision for r in reqs]
    counts = {a: sum(e.action == a for e in entries) for a in ("load", "partial", "recompute")}
    counts["miss"] = sum(e.action == "miss" for e in entries)
    judged = [e for e in entries if e.faster is not None]
    errors = [abs(e.error) for e in entries if e.actual_s > 0]
    chosen = [abs(e.error) for e in entries if e.action != "miss" and e.actual_s > 0]
    within = sum(err <= PREDICTION_TOLERANCE for err in errors)
    total_kv, total_base = sum(kv_ttft), sum(base_ttft)
    return {
        "requests": len(reqs),
        "tokens_identical": all(r.tokens_match for r in reqs),
        "requests_same_tokens": sum(r.tokens_match for r in reqs),
        "logits_max_diff": max((r.logits_max_diff for r in reqs), default=0.0),
        "ttft": {
            "kvtier_total_s": total_kv,
            "recompute_total_s": total_base,
            "kvtier_median_s": median(kv_ttft),
            "recompute_median_s": median(base_ttft),
            "speedup": total_base / total_kv if total_kv > 0 else None,
            "seconds_saved": total_base - total_kv,
        },
        "tokens": {
            "prompt": prompt,
            "reused": reused,
            "computed": prompt - reused,
            "reused_share": reused / prompt if prompt else 0.0,
            "looked_up_chunks": lookup_chunks,
            "hit_chunks": sum(t["hit_chunks"] for t in tiers.values()),
            "hit_tokens": sum(t["hit_tokens"] for t in tiers.values()),
        },
        "tiers": tiers,
        "decisions": {
            "counts": counts,
            "measured": len(judged),
            "chose_faster": sum(bool(e.faster) for e in judged),
            "accuracy": sum(bool(e.faster) for e in judged) / len(judged) if judged else None,
            "predicted": len(errors),
            "within_tolerance": within,
            "tolerance": PREDICTION_TOLERANCE,
            "median_abs_error": median(errors),
            "median_abs_error_decisions": median(chosen),
            "predicted_s": sum(e.predicted_s for e in entries),
            "actual_s": sum(e.actual_s for e in entries),
        },
        "break_even_tokens": {name: v["tokens"] for name, v in report.break_even.items()},
    }


# --- rich rendering -----------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def render(report: RunReport, console) -> None:
    """Print the report as rich tables on ``console``."""
    from rich.table import Table

    from kvtier.specs.units import format_bytes

    s = report.summary()
    m = report.model
    prof = report.profile
    console.print(
        f"[bold]kvtier run[/]: {m['model_id']} {m['dtype']} on {m['device']} "
        f"({m['threads']} threads), chunk {m['chunk_tokens']} tokens = "
        f"{format_bytes(m['chunk_bytes'])}; tiers " + " → ".join(t["name"] for t in report.tiers)
    )
    console.print(
        f"profile: {prof['source']} ({prof['reason']}"
        + (f"; measured now: {', '.join(prof['measured'])}" if prof["measured"] else "")
        + f"), {prof['seconds']:.1f} s"
        + (
            f"; prefill curve refined with the {prof['refined']['observed']} prefill forwards "
            "kvtier ran"
            if prof.get("refined")
            else ""
        )
    )

    req = Table(title="requests: time to first token, kvtier vs recompute-only", show_lines=False)
    for col in (
        "#",
        "session",
        "turn",
        "prompt",
        "reused",
        "from",
        "decision",
        "pred",
        "actual",
        "TTFT kvtier",
        "TTFT recompute",
        "saved",
        "same tokens",
    ):
        req.add_column(col, justify="left" if col in ("session", "from", "decision") else "right")
    for r in report.requests:
        d = r.decision
        tiers = ",".join(f"{k}:{v}" for k, v in r.kvtier["per_tier"].items()) or "–"
        req.add_row(
            str(r.index),
            r.session,
            str(r.turn + 1),
            str(r.prompt_tokens),
            str(r.kvtier["reused_tokens"]),
            tiers,
            d.action + ("" if d.faster is None else (" ✓" if d.faster else " ✗")),
            _s(d.predicted_s),
            _s(d.actual_s),
            _s(r.kvtier_ttft_s),
            _s(r.recompute_ttft_s),
            _s(r.saved_s),
            "yes" if r.tokens_match else "[red]NO[/]",
        )
    console.print(req)

    tt = Table(title="tiers")
    for col in (
        "tier",
        "hit chunks",
        "hit tokens",
        "hit rate",
        "loaded",
        "read",
        "written",
        "not admitted",
        "evictions",
        "break-even",
        "check: reload vs recompute",
    ):
        tt.add_column(col, justify="left" if col.startswith(("tier", "check")) else "right")
    for name, t in s["tiers"].items():
        even = report.break_even.get(name, {})
        checks = "; ".join(
            f"{c['tokens']} tok: {_s(c['reload_s'])} vs {_s(c['recompute_s'])}"
            + (" ✓" if c["agrees"] else " ✗")
            for c in even.get("checks", [])
        )
        tokens = even.get("tokens")
        tt.add_row(
            name,
            str(t["hit_chunks"]),
            str(t["hit_tokens"]),
            _pct(t["hit_rate"]),
            str(t["loaded_chunks"]),
            format_bytes(t["bytes_read"]),
            format_bytes(t["bytes_written"]),
            str(t["not_admitted"]),
            str(t["evictions"]),
            "never" if tokens is None else f"{tokens} tokens",
            checks or "–",
        )
    console.print(tt)

    d = s["decisions"]
    c = d["counts"]
    ttft = s["ttft"]
    tok = s["tokens"]
    console.print(
        f"decisions: load {c['load']}, partial {c['partial']}, recompute {c['recompute']}, "
        f"miss {c['miss']}; chose the faster path {d['chose_faster']}/{d['measured']} measured "
        f"({_pct(d['accuracy'])}); predicted within {d['tolerance']:.0%} of actual: "
        f"{d['within_tolerance']}/{d['predicted']} (median |error| "
        f"{_pct(d['median_abs_error'])}, decisions only {_pct(d['median_abs_error_decisions'])})"
    )
    console.print(
        f"TTFT total: kvtier {_s(ttft['kvtier_total_s'])} vs recompute "
        f"{_s(ttft['recompute_total_s'])} (×{ttft['speedup']:.1f}), saved "
        f"{_s(ttft['seconds_saved'])}; median {_s(ttft['kvtier_median_s'])} vs "
        f"{_s(ttft['recompute_median_s'])}"
    )
    exact = bool(report.config.get("exact"))
    same = (
        "yes"
        if s["tokens_identical"]
        else f"{s['requests_same_tokens']}/{s['requests']} requests"
        + (
            " (a prefill split at a chunk boundary rounds differently from a one-shot "
            "prefill; --exact makes them identical)"
            if not exact
            else ""
        )
    )
    console.print(
        f"tokens: {tok['reused']}/{tok['prompt']} prompt tokens reused "
        f"({_pct(tok['reused_share'])}); identical generated tokens: {same}; "
        f"max |Δ logit| of the prefill {s['logits_max_diff']:.3g} "
        + (
            "(exact mode: chunk-aligned forwards in both runs)"
            if exact
            else "(one forward over the new tokens; --exact for bit-identical logits)"
        )
    )
    if report.admission:
        parts = []
        for name, a in report.admission.items():
            refused = ", ".join(f"{k} {v}" for k, v in a["refused"].items()) or "none"
            parts.append(f"{name}: refused {refused}")
        console.print("admission (expected reuse vs store cost): " + "; ".join(parts))
    tm = report.timing
    console.print(
        f"time: model load {_s(tm.get('model_load_s'))}, profile {_s(tm.get('profile_s'))}, "
        f"kvtier requests {_s(tm.get('kvtier_s'))}, recompute-only {_s(tm.get('recompute_s'))}, "
        f"wall {_s(tm.get('wall_s'))}; load average {report.load_average}"
    )
