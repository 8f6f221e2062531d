"""``kvtier simulate``'s tables: the run's summary, its tiers and links, or a sweep."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.sim.results import SimResult


def _s(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _gb(value: float | None) -> str:
    return "unlimited" if not value else f"{value / 1e9:,.2f} GB"


def render(result: SimResult, console: Console) -> None:
    """The summary of one simulation."""
    s = result.summary
    lat = Table(title=f"{s['finished']} of {s['requests']} requests in {s['duration_s']:.1f} s")
    for col in ("", "p50", "p95", "p99", "mean"):
        lat.add_column(col, justify="right")
    for name in ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s", "load_wait_s"):
        p = s[name]
        lat.add_row(name, *(_s(p[k]) for k in ("p50", "p95", "p99", "mean")))
    console.print(lat)
    gpu, tp, good = s["gpu_time"], s["throughput"], s["goodput"]
    console.print(
        f"GPU time: computing {_pct(gpu['compute_share'])}, waiting for KV "
        f"{_pct(gpu['kv_wait_share'])}, idle {_pct(gpu['idle_share'])}; "
        f"{tp['output_tokens_per_s']:.1f} output tokens/s, {tp['requests_per_s']:.3f} requests/s; "
        f"goodput {good['requests_per_s']:.3f} requests/s ({_pct(good['share'])} within TTFT "
        f"{good['slo_ttft_s']} s, TPOT {good['slo_tpot_s']} s); preemptions {s['preemptions']}"
    )
    hits = Table(title="prompt tokens served from")
    hits.add_column("source")
    hits.add_column("tokens", justify="right")
    hits.add_column("share", justify="right")
    for tier, n in sorted(s["hit_tokens"].items(), key=lambda kv: -kv[1]):
        hits.add_row(tier, f"{n:,}", _pct(s["hit_rate"].get(tier)))
    computed = s["computed_tokens"]
    hits.add_row("computed", f"{computed:,}", _pct(computed / max(s["prompt_tokens"], 1)))
    console.print(hits)
    if s["tiers"]:
        tiers = Table(title="tiers")
        for col in ("tier", "capacity", "held", "written", "read", "evicted", "DWPD", "rated"):
            tiers.add_column(col, justify="right")
        for name, t in s["tiers"].items():
            tiers.add_row(
                name,
                _gb(t["capacity_bytes"]),
                _gb(t["held_bytes"]),
                _gb(t["written_bytes"]),
                _gb(t["read_bytes"]),
                f"{t['evicted_blocks']:,}",
                _s(t["drive_writes_per_day"], 2),
                _s(t["rated_dwpd"], 1),
            )
        console.print(tiers)
    if s["links"]:
        links = Table(title="links")
        for col in ("link", "moved", "busy s", "utilisation"):
            links.add_column(col, justify="right")
        for name, link in s["links"].items():
            links.add_row(
                name, _gb(link["bytes"]), _s(link["busy_s"], 2), _pct(link["utilization"])
            )
        console.print(links)


def render_sweep(
    name: str, rows: list[dict[str, Any]], console: Console, series: str | None = None
) -> None:
    """One row per swept value (per combination, with a second parameter ``series``): latency,
    GPU time split, preemptions, the share of prompt tokens served from cache, the busiest
    link."""
    swept = (name,) if series is None else (name, series)
    table = Table(title=f"sweep of {' × '.join(swept)}")
    cols = (
        *swept, "hits", "TTFT p50", "TTFT p95", "TPOT p50", "tok/s", "goodput", "compute",
        "KV wait", "idle", "preempt", "busiest link",
    )  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        link = r["busiest_link"]
        util = r["busiest_link_utilization"]
        table.add_row(
            *(str(r[n]) for n in swept),
            _pct(r.get("hit_share")),
            _s(r["ttft_p50_s"]),
            _s(r["ttft_p95_s"]),
            _s(r["tpot_p50_s"], 4),
            f"{r['throughput_tok_s']:.0f}",
            _pct(r["goodput_share"]),
            _pct(r["compute_share"]),
            _pct(r["kv_wait_share"]),
            _pct(r["idle_share"]),
            str(r["preemptions"]),
            f"{link} {_pct(util)}" if link else "—",
        )
    console.print(table)


__all__ = ["render", "render_compare", "render_sweep"]


def render_compare(found: dict[str, Any], console: Console) -> None:
    """Measured against simulated, per phase of a replayed run."""
    table = Table(title=f"replay of {found['trace']}")
    for col in ("phase", "requests", "", "measured", "simulated", "error"):
        table.add_column(col, justify="right")
    for row in found["phases"]:
        first = True
        for name in ("ttft_s", "e2e_s"):
            for q in ("p50", "p95"):
                fig = row[name]
                err = fig["error"][q]
                table.add_row(
                    row["system"] if first else "",
                    str(row["requests"]) if first else "",
                    f"{name[:-2]} {q}",
                    _s(fig["measured"][q]),
                    _s(fig["simulated"][q]),
                    "—" if err is None else f"{100 * err:+.1f} %",
                )
                first = False
        pre = row["preemptions"]
        table.add_row("", "", "preemptions", str(pre["measured"]), str(pre["simulated"]), "")
    console.print(table)
