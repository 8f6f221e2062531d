"""PNG plots of a vLLM run: TTFT by system, where prompt tokens came from, TTFT over time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier.job.plot import plot_writer, save, subplots
from kvtier.job.vllm_report import ENGINE_TIER, RequestRecord, VllmRunReport

COLORS = {"vllm": "#c0504d", "vllm+kvtier": "#4f81bd", "vllm+kvtier+codec": "#9bbb59"}
SOURCE_COLORS = {
    "computed": "#bbbbbb",
    ENGINE_TIER: "#9bbb59",
    "dram": "#4f81bd",
    "disk": "#8064a2",
}


def _title(report: VllmRunReport) -> str:
    return f"{report.model.get('model_id')}\n{report.machine.get('cpu')}"


def _seconds_axis(axis) -> None:
    """A log axis of seconds labelled 0.5, 1, 2, 10 … rather than powers of ten."""
    from matplotlib.ticker import FormatStrFormatter

    axis.set_major_formatter(FormatStrFormatter("%g"))
    axis.set_minor_formatter(FormatStrFormatter(""))


def _ttft_scatter(
    ax: Any, report: VllmRunReport, x: Callable[[RequestRecord], float], **style: Any
) -> None:
    """Each system's requests as points: ``x`` of the request against its TTFT (log seconds)."""
    for phase in report.phases:
        ax.scatter(
            [x(r) for r in phase.requests],
            [r.ttft_s for r in phase.requests],
            s=14,
            label=phase.system,
            c=COLORS.get(phase.system),
            **style,
        )
    ax.set_yscale("log")
    _seconds_axis(ax.yaxis)
    ax.set_ylabel("time to first token (s)")


def plot_ttft(report: VllmRunReport, path: Path) -> Path:
    """Left: TTFT distribution (CDF) per system; right: TTFT against prompt length."""
    fig, (cdf, scatter) = subplots(1, 2, figsize=(10, 4))
    for phase in report.phases:
        ttft = sorted(r.ttft_s for r in phase.requests)
        n = len(ttft)
        color = COLORS.get(phase.system)
        cdf.step(ttft, [(i + 1) / n for i in range(n)], where="post", label=phase.system, c=color)
    _ttft_scatter(scatter, report, lambda r: r.prompt_tokens, alpha=0.8)
    cdf.set_xscale("log")
    _seconds_axis(cdf.xaxis)
    cdf.set_xlabel("time to first token (s)")
    cdf.set_ylabel("share of requests")
    cdf.legend(fontsize=8)
    scatter.set_xlabel("prompt tokens")
    fig.suptitle(f"time to first token: {_title(report)}", fontsize=9)
    return save(fig, path)


def plot_sources(report: VllmRunReport, path: Path) -> Path:
    """Stacked bars per system: prompt tokens computed, found in vLLM's pool, in each tier."""
    systems = report.summary()["systems"]
    names = list(systems)
    order = list(SOURCE_COLORS)
    tiers = {t for s in systems.values() for t in s["hit_tokens"]}
    sources = ["computed", *sorted(tiers, key=lambda t: (order.index(t) if t in order else 9, t))]
    fig, ax = subplots(figsize=(7, 4.2))
    bottom = [0.0] * len(names)
    for source in sources:
        values = [
            float(
                systems[n]["computed_tokens"]
                if source == "computed"
                else systems[n]["hit_tokens"].get(source, 0)
            )
            for n in names
        ]
        label = {"computed": "computed", ENGINE_TIER: "vLLM pool"}.get(source, f"kvtier {source}")
        ax.bar(names, values, bottom=bottom, label=label, color=SOURCE_COLORS.get(source))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("prompt tokens")
    ax.set_title(f"where prompt tokens came from: {_title(report)}", fontsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save(fig, path)


def plot_timeline(report: VllmRunReport, path: Path) -> Path:
    """TTFT of each request at the time it was sent, per system."""
    fig, ax = subplots(figsize=(9, 3.8))
    _ttft_scatter(ax, report, lambda r: r.sent_s)
    ax.set_xlabel("seconds into the phase (request sent)")
    ax.set_title(f"TTFT over the run: {_title(report)}", fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, path)


#: ``write_plots(report, directory)``: every plot of a vLLM run into ``directory`` (created),
#: each ``plot_<name>`` as ``run-vllm-<name>.png``; the paths written.
write_plots = plot_writer("run-vllm-", plot_ttft, plot_sources, plot_timeline)


__all__ = ["plot_sources", "plot_timeline", "plot_ttft", "write_plots"]
