"""Human-readable rendering of a Plan as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvtier.plan.planner import Plan, gb


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def _tokens(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return f"{n:,}"


def _pct(x: float) -> str:
    return f"{x:.0%}" if x < 10 else ">999%"


def render(result: Plan, console: Console) -> None:
    """Print the plan: memory budget, sweep, reload vs recompute, failure sequence, notes."""
    i, cap = result.inputs, result.capacity
    console.print(
        f"[bold]kvtier plan[/bold] — {escape(i['model'])} ({i['attention']}, KV {i['kv_dtype']}, "
        f"weights {i['weight_dtype']}) on {i['gpus']}× {i['gpu']}, "
        f"{i['context']:,}-token context"
    )

    mem = Table(title="Memory per GPU", show_header=False, title_justify="left")
    mem.add_column(style="bold")
    mem.add_column(justify="right")
    mem.add_column(style="dim")
    mem.add_row("HBM", gb(cap.hbm_bytes_per_gpu), "")
    mem.add_row(
        "weights", gb(cap.weights_bytes_per_gpu), f"{gb(cap.weights_bytes_total)} over all GPUs"
    )
    mem.add_row("runtime reserve", gb(cap.reserve_bytes_per_gpu), "--reserve")
    mem.add_row("HBM left for KV", gb(cap.kv_pool_bytes_per_gpu), f"{cap.kv_pool_tokens:,} tokens")
    mem.add_row(
        "KV per token",
        f"{cap.kv_bytes_per_token_per_gpu:,.0f} B",
        f"{cap.kv_bytes_per_token_total:,.0f} B over all GPUs",
    )
    mem.add_row(
        "KV per request",
        gb(cap.kv_bytes_per_request_per_gpu),
        f"{gb(cap.kv_bytes_per_request_total)} over all GPUs at {i['context']:,} tokens",
    )
    mem.add_row(
        "longest context that fits",
        f"{cap.kv_pool_tokens:,}",
        f"tokens at concurrency 1; {cap.kv_pool_tokens // max(i['concurrency']):,} at "
        f"{max(i['concurrency'])}",
    )
    mem.add_row(
        "largest concurrency that fits",
        f"[bold]{cap.max_concurrency}[/bold]",
        f"KV overflows HBM at {cap.overflow_concurrency}",
    )
    console.print(mem)

    roles = [t["role"] for t in i["tiers"]]
    sweep = Table(title="Along rising concurrency (bytes: all GPUs)", title_justify="left")
    sweep.add_column("conc", justify="right")
    sweep.add_column("KV demand", justify="right")
    sweep.add_column("in HBM", justify="right")
    for role in roles:
        sweep.add_column(f"→ {role}", justify="right")
    sweep.add_column("dropped", justify="right")
    sweep.add_column("req/s", justify="right")
    sweep.add_column("GPU waits", justify="right")
    sweep.add_column("link busy", justify="right")
    if "nvme" in roles:
        sweep.add_column("NVMe DWPD", justify="right")
    sweep.add_column("flags", style="yellow")
    overflow = cap.overflow_concurrency
    for r in result.rows:
        cells = [
            f"[bold red]{r.concurrency}[/bold red]"
            if r.concurrency == overflow
            else str(r.concurrency),
            gb(r.kv_demand_bytes),
            gb(r.hbm_kv_bytes),
            *[gb(r.spill_bytes[role]) if r.spill_bytes[role] else "·" for role in roles],
            gb(r.unplaced_bytes) if r.unplaced_bytes else "·",
            f"{r.request_rate:.3g}",
            _pct(r.gpu_wait_fraction),
            _pct(r.link_utilization),
        ]
        if "nvme" in roles:
            dwpd = r.nvme_drive_writes_per_day
            cells.append("—" if dwpd is None else f"{dwpd:.2f}")
        cells.append(", ".join(r.flags))
        sweep.add_row(*cells)
    console.print(sweep)

    if result.tiers:
        cmp = Table(
            title="Reload vs recompute per GPU (×N: reload N× faster)",
            title_justify="left",
        )
        cmp.add_column("prefix", justify="right")
        cmp.add_column("recompute", justify="right")
        for t in result.tiers:
            cmp.add_column(f"{t.role} ({t.medium})", justify="right")
        lengths = [c.tokens for c in result.tiers[0].comparisons]
        for k, n in enumerate(lengths):
            cells = [_tokens(n), _seconds(result.tiers[0].comparisons[k].recompute_s)]
            for t in result.tiers:
                c = t.comparisons[k]
                style = "green" if c.ratio > 1 else "red"
                cells.append(f"{_seconds(c.reload_s)} [{style}]×{c.ratio:.3g}[/{style}]")
            cmp.add_row(*cells)
        cells = ["[bold]break-even[/bold]", ""]
        for t in result.tiers:
            be = t.break_even_tokens
            unit = "token" if be == 1 else "tokens"
            cells.append("never" if be is None else f"[bold]{be:,}[/bold] {unit}")
        cmp.add_row(*cells)
        cells = ["reload path", ""]
        for t in result.tiers:
            fixed = t.latency_s + t.request_s
            cells.append(f"{_seconds(fixed)} + {t.reload_bandwidth_per_gpu / 1e9:.1f} GB/s")
        cmp.add_row(*cells)
        console.print(cmp)

    console.print("[bold]Failure sequence[/bold]")
    if result.events:
        for e in result.events:
            console.print(f"  [red]c={e.concurrency:>4}[/red]  {escape(e.message)}")
    else:
        console.print("  nothing gives way in the planned range")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    console.print("[bold]Assumptions[/bold]")
    for note in result.notes:
        console.print(f"  [dim]· {escape(note)}[/dim]")
