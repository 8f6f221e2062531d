"""PNG plots of a run: TTFT per request both ways, per-tier hits and bytes, predicted vs actual."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.job.hf_report import RunReport
from kvtier.job.plot import Bars, paired_bars, plot_writer, save, subplots

#: Marker colour per decision action in the predicted-vs-actual plot.
ACTION_COLORS = {"load": "#4f81bd", "partial": "#9bbb59", "recompute": "#c0504d", "miss": "#7f7f7f"}
MIB = 1024 * 1024


def plot_ttft(report: RunReport, path: Path) -> Path:
    """Grouped bars: time to first token per request, kvtier vs recompute-only (log scale)."""
    reqs = report.requests
    labels = [f"{r.session}#{r.turn + 1}" for r in reqs]
    fig, ax = subplots(figsize=(max(6.0, 0.45 * len(reqs) + 2), 4.2))
    paired_bars(
        ax,
        Bars("recompute-only", [r.recompute_ttft_s for r in reqs], "#c0504d"),
        Bars("kvtier", [r.kvtier_ttft_s for r in reqs], "#4f81bd"),
    )
    ax.set_yscale("log")
    ax.set_ylabel("time to first token (s)")
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    m = report.model
    ax.set_title(f"TTFT per request: {m['model_id']} {m['dtype']} on {m['device']}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return save(fig, path)


def _tier_panel(ax: Any, names: list[str], left: Bars, right: Bars, unit: str, title: str) -> None:
    """One panel of :func:`plot_tiers`: two figures per tier side by side."""
    paired_bars(ax, left, right)
    ax.set_xticklabels(names)
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend()


def plot_tiers(report: RunReport, path: Path) -> Path:
    """Per tier: hit tokens and loaded tokens; bytes read and written."""
    tiers = report.summary()["tiers"]
    names = list(tiers)

    def per_tier(key: str, unit: float = 1.0) -> list[float]:
        return [tiers[n][key] / unit for n in names]

    fig, (left, right) = subplots(1, 2, figsize=(9, 3.8))
    hits, loaded = Bars("hit", per_tier("hit_tokens")), Bars("loaded", per_tier("loaded_tokens"))
    _tier_panel(left, names, hits, loaded, "tokens", "hits per tier")
    read = Bars("read", per_tier("bytes_read", MIB))
    written = Bars("written", per_tier("bytes_written", MIB))
    _tier_panel(right, names, read, written, "MiB", "bytes moved per tier")
    return save(fig, path)


def plot_predictions(report: RunReport, path: Path) -> Path:
    """Predicted vs actual seconds of each request's chosen path (load + prefill), log-log."""
    fig, ax = subplots(figsize=(4.8, 4.4))
    for action, color in ACTION_COLORS.items():
        pts = [
            (r.decision.actual_s, r.decision.predicted_s)
            for r in report.requests
            if r.decision.action == action and r.decision.actual_s > 0
        ]
        if pts:
            ax.scatter([a for a, _ in pts], [p for _, p in pts], label=action, color=color, s=18)
    vals = [
        v for r in report.requests for v in (r.decision.actual_s, r.decision.predicted_s) if v > 0
    ]
    if vals:
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="0.9")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("actual s (load + prefill)")
    ax.set_ylabel("predicted s")
    ax.set_title("decision: predicted vs actual (±20 %)")
    ax.legend(fontsize=8)
    return save(fig, path)


#: ``write_plots(report, directory)``: every plot of a run into ``directory`` (created), each
#: ``plot_<name>`` as ``run-<name>.png``; the paths written.
write_plots = plot_writer("run-", plot_ttft, plot_tiers, plot_predictions)
