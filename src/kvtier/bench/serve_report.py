"""Rendering of ``kvtier bench serve``: rich tables, JSON text and an optional PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvtier.bench.serve_config import CEILING, REFERENCE, SYSTEMS
from kvtier.bench.serve_results import (
    GAIN_METRICS,
    RunResult,
    ServeReport,
    Target,
    iter_prefix_runs,
)
from kvtier.specs import format_bytes


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _share(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def _shares(report: ServeReport, run: RunResult) -> str:
    """The run's share of the ceiling's gain on each of :data:`GAIN_METRICS`, in percent."""
    if run.system in (REFERENCE, CEILING):
        return "–"
    if report.nothing_to_gain(run.concurrency):
        return "nothing to gain"
    shares = [report.share_of_gain(run.system, run.concurrency, m) for m in GAIN_METRICS]
    if all(x is None for x in shares):
        return "–"
    return " · ".join("–" if x is None else f"{100 * x:.0f}" for x in shares) + " %"


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _tokens(run: RunResult) -> str:
    """kvtier's tokens: held beyond vLLM's own cache / loaded (by tier)."""
    k = run.cache
    if not k.kvtier_hit_tokens and not k.kvtier_loaded_tokens and not k.tier_hit_tokens:
        return "–"
    tiers = ", ".join(f"{t} {v:,.0f}" for t, v in k.tier_hit_tokens.items())
    loaded = f"{k.kvtier_loaded_tokens:,.0f}" + (f" ({tiers})" if tiers else "")
    return f"{k.kvtier_hit_tokens:,.0f} / {loaded}"


def _verdict(t: Target) -> Text:
    style = {"PASS": "bold green", "MISS": "bold red"}.get(t.verdict, "dim")
    return Text(t.verdict, style=style)


def prefix_table(report: ServeReport) -> Table:
    """One row per concurrency and system: the client's TTFT and throughput, the caches."""
    p = report.config.prefix
    tiers = report.tiers
    if p.trace is not None:
        shape = p.trace.shape()
    elif p.sessions:
        shape = (
            f"sessions: {p.num_prefixes} chats × {p.prompts_per_prefix} turns, first message "
            f"{p.prefix_tokens + p.suffix_tokens} tokens, then {p.output_tokens}-token answer + "
            f"{p.suffix_tokens}-token message a turn; "
        )
    else:
        shape = (
            f"prefix_repetition: {p.num_prefixes} prefixes × {p.prompts_per_prefix} prompts, "
            f"prefix {p.prefix_tokens} + suffix {p.suffix_tokens} tokens, {p.output_tokens} out; "
        )
    title = (
        shape
        + f"vLLM pool {tiers.get('pool_blocks')} blocks ({tiers.get('pool_tokens')} tokens) vs "
        f"prefixes {p.prefix_blocks} blocks; TTFT in ms (vLLM's client); of the gain: the share "
        "of the ceiling's saving over vLLM alone (a pool that holds everything, when run) on "
        "TTFT p50 · mean · p99 · the run's duration; load: 1-minute load average at the run's "
        "start → end"
    )
    if report.config.reuse_rounds > 1:
        title += f"; {report.config.reuse_rounds} rounds (r1, r2, …), " + (
            "every server up throughout, the runs alternating (the order turned by one a "
            "round, fresh requests each round): shares from medians over rounds, ratios "
            "to vLLM alone the median of each round's"
            if report.config.interleave
            else "every system started afresh each round in an order turned by one: ratios "
            "and shares from medians over rounds"
        )
    table = Table(title=title, title_justify="left")
    for name in (
        "conc",
        "system",
        "ok/fail",
        "TTFT mean",
        "TTFT p50",
        "TTFT p99",
        "p50 vs vLLM",
        "of the gain",
        "req/s",
        "tok/s",
        "vLLM cache hits",
        "connector hits",
        "kvtier held / loaded tokens",
        "s",
        "load",
    ):
        table.add_column(
            name, justify="left" if name in ("system", "kvtier held / loaded tokens") else "right"
        )
    last = None
    for run in iter_prefix_runs(report):
        if last is not None and run.concurrency != last:
            table.add_section()
        last = run.concurrency
        cl = run.client
        speedup = report.speedup(run.system, run.concurrency)
        table.add_row(
            str(run.concurrency),
            run.system + (f" r{run.round + 1}" if report.config.reuse_rounds > 1 else ""),
            f"{cl.completed}/{cl.failed}",
            _ms(cl.ttft_mean_ms),
            _ms(cl.ttft_median_ms),
            _ms(cl.ttft_p99_ms),
            "ref" if run.system == REFERENCE else _times(speedup),
            _shares(report, run),
            f"{cl.request_throughput:.3f}",
            f"{cl.total_token_throughput:,.0f}",
            _share(run.cache.local_hit_rate),
            _share(run.cache.external_hit_rate),
            _tokens(run),
            f"{cl.duration_s:.0f}",
            f"{run.load[0]:.1f}→{run.load[1]:.1f}",
        )
    return table


def random_table(report: ServeReport) -> Table | None:
    """The no-reuse rounds: throughput per system and round, and the medians."""
    r = report.config.random
    runs = [x for x in report.runs if x.dataset == "random"]
    if r is None or not runs:
        return None
    how = "alternating" if report.config.alternating() else "one system after the other"
    table = Table(
        title=(
            f"random (no reuse): {r.prompts} prompts of {r.input_tokens} tokens, "
            f"{r.output_tokens} out, concurrency {r.concurrency}; {r.repeats} round(s), {how}"
        ),
        title_justify="left",
    )
    columns = ("system", "rounds: total tok/s", "median tok/s", "vs vLLM", "TTFT p50")
    for name in (*columns, "engine core CPU a round", "fail"):
        table.add_column(name, justify="left" if name == "system" else "right")
    ref = report.random_throughput(REFERENCE)
    for system in report.config.random_systems():
        mine = report.random_runs(system)
        if not mine:
            continue
        med = report.random_throughput(system)
        ratio = None if med is None or not ref else med / ref
        table.add_row(
            system,
            ", ".join(f"{x.client.total_token_throughput:,.0f}" for x in mine),
            f"{med:,.0f}" if med else "–",
            "ref" if system == REFERENCE else (f"{ratio:.3f}" if ratio else "–"),
            _ms(sorted(x.client.ttft_median_ms for x in mine)[len(mine) // 2]),
            f"{spin:.1f} s" if (spin := report.random_engine_cpu(system)) is not None else "–",
            str(sum(x.client.failed for x in mine)),
        )
    return table


def preload_table(report: ServeReport) -> Table | None:
    """The preloading check: each system's wait for KV and TTFT of the prompts from disk."""
    result = report.preload
    if result is None or not result.runs:
        return None
    w = result.workload
    table = Table(
        title=(
            f"preloading: {w.hits} prompts of {w.tokens} tokens with their KV on disk, queued "
            f"among {w.hits} cold ones (vLLM's pool holds two requests)"
        ),
        title_justify="left",
    )
    for name in ("system", "wait for KV", "loads", "loaded tok", "hit TTFT p50", "cold TTFT p50"):
        table.add_column(name, justify="left" if name == "system" else "right")
    for system, run in result.runs.items():
        cold = sorted(run.cold_ttft_s)[len(run.cold_ttft_s) // 2] if run.cold_ttft_s else None
        table.add_row(
            system,
            f"{run.wait_s:.3f} s",
            str(len(run.load_waits_s)),
            f"{run.loaded_tokens:,}",
            _ms(run.hit_ttft_p50_s * 1e3 if run.hit_ttft_p50_s is not None else None),
            _ms(cold * 1e3 if cold is not None else None),
        )
    return table


def targets_table(report: ServeReport) -> Table:
    """The measured ratios next to the issue's thresholds."""
    gaps = report.config.shape_gaps()
    shape = "the issue's target shape" if not gaps else "not the target shape: " + "; ".join(gaps)
    table = Table(title=f"ratios vs the issue's thresholds ({shape})", title_justify="left")
    for name in ("ratio", "measured", "threshold", "verdict", "detail"):
        table.add_column(name, justify="right" if name == "measured" else "left")
    for t in report.targets():
        shown = "–" if t.measured is None else f"{t.measured:.3f}"
        table.add_row(t.name, shown, t.required, _verdict(t), t.detail)
    return table


def serve_table(report: ServeReport) -> Group:
    """The whole report as rich renderables: tables, then the machine and the systems."""
    env = report.environment
    parts: list = [prefix_table(report)]
    rand = random_table(report)
    if rand is not None:
        parts.append(rand)
    pre = preload_table(report)
    if pre is not None:
        parts.append(pre)
    parts.append(targets_table(report))
    t = report.tiers
    lines = [
        f"machine: {env.get('cpu')}, {env.get('cpus')} CPUs; vLLM {env.get('vllm')}; model "
        f"{env.get('model')} {env.get('dtype', 'bfloat16')}; load average "
        f"{env.get('load_average_start')} → "
        f"{env.get('load_average_end')}; {report.seconds:.0f} s in all",
        f"kvtier tiers: dram {format_bytes(t.get('dram_bytes', 0))} (slab:// in /dev/shm), "
        f"disk {format_bytes(t.get('disk_bytes', 0))} (slab:// on {env.get('filesystem')}), "
        f"chunks of {t.get('chunk_tokens')} tokens; max model length {t.get('max_model_len')}",
    ]
    for info in report.systems:
        if info.error:
            lines.append(f"[red]{info.system}: FAILED[/] {info.error} (log {info.log})")
        elif info.warmup is not None:
            w = info.warmup
            lines.append(
                f"{info.system}: started in {info.startup_s:.0f} s; cold {w.cold_tokens}-token "
                f"prompt {w.cold_s:.2f} s ({w.prefill_tokens_per_s:,.0f} tok/s)"
            )
    lines += [f"[yellow]ceiling[/]: {c}" for c in report.config.ceiling_caveats()]
    errors = {e for run in report.runs for e in run.client.errors}
    if errors:
        lines.append(f"[red]client errors[/]: {'; '.join(sorted(errors)[:3])}")
    parts.extend(Text.from_markup(line) for line in lines)
    return Group(*parts)


def serve_json(report: ServeReport, detailed: bool = False, stamp: dict | None = None) -> str:
    """The report as indented JSON, with ``stamp`` (the day and command of the run) on top."""
    return json.dumps({**report.to_dict(detailed), **(stamp or {})}, indent=2)


def serve_plot(report: ServeReport, path: Path) -> Path:
    """TTFT p50 (bars) and p99 (ticks) per system and concurrency; the random throughput.

    ``path`` is a PNG file, or a folder that gets ``bench-serve.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix.lower() != ".png":
        path.mkdir(parents=True, exist_ok=True)
        path = path / "bench-serve.png"
    systems = [s for s in SYSTEMS if s in report.config.systems]
    levels = list(report.config.concurrency)
    has_random = bool(report.random_runs(REFERENCE) or report.random_runs("kvtier"))
    fig, axes = plt.subplots(1, 2 if has_random else 1, figsize=(12 if has_random else 8, 4.5))
    ax = axes[0] if has_random else axes
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, p50, p99 = [], [], []
        for j, c in enumerate(levels):
            median, tail = report.figure(system, c, "p50"), report.figure(system, c, "p99")
            if median is None or tail is None:
                continue
            xs.append(j + i * width)
            p50.append(median / 1e3)
            p99.append(tail / 1e3)
        ax.bar(xs, p50, width, label=system)
        ax.scatter(xs, p99, marker="_", s=200, color="black")
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(levels))])
    ax.set_xticklabels([f"concurrency {c}" for c in levels])
    ax.set_ylabel("TTFT p50 (bars), p99 (ticks), s")
    ax.set_title(f"{report.config.prefix.dataset}: time to first token")
    ax.legend()
    if has_random:
        ax2 = axes[1]
        names, values = [], []
        for system in report.config.random_systems():
            v = report.random_throughput(system)
            if v:
                names.append(system)
                values.append(v)
        ax2.bar(names, values, color=["tab:blue", "tab:orange"][: len(names)])
        ax2.set_ylabel("total tokens/s (median of rounds)")
        ax2.set_title("random (no reuse): throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["prefix_table", "random_table", "serve_json", "serve_plot", "serve_table"]
