"""PNG plots of a run: TTFT per request both ways, per-tier hits and bytes, predicted vs actual."""

from __future__ import annotations

from pathlib import Path

from kvtier.job.hf_report import RunReport


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ttft(report: RunReport, path: Path) -> Path:
    """Grouped bars: time to first token per request, kvtier vs recompute-only (log scale)."""
    plt = _pyplot()
    reqs = report.requests
    labels = [f"{r.session}#{r.turn + 1}" for r in reqs]
    x = range(len(reqs))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(reqs) + 2), 4.2))
    width = 0.4
    ax.bar(
        [i - width / 2 for i in x],
        [r.recompute_ttft_s for r in reqs],
        width,
        label="recompute-only",
        color="#c0504d",
    )
    ax.bar(
        [i + width / 2 for i in x],
        [r.kvtier_ttft_s for r in reqs],
        width,
        label="kvtier",
        color="#4f81bd",
    )
    ax.set_yscale("log")
    ax.set_ylabel("time to first token (s)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    m = report.model
    ax.set_title(f"TTFT per request: {m['model_id']} {m['dtype']} on {m['device']}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_tiers(report: RunReport, path: Path) -> Path:
    """Per tier: hit tokens and loaded tokens; bytes read and written."""
    plt = _pyplot()
    tiers = report.summary()["tiers"]
    names = list(tiers)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    x = range(len(names))
    w = 0.4
    left.bar([i - w / 2 for i in x], [tiers[n]["hit_tokens"] for n in names], w, label="hit")
    left.bar([i + w / 2 for i in x], [tiers[n]["loaded_tokens"] for n in names], w, label="loaded")
    left.set_xticks(list(x))
    left.set_xticklabels(names)
    left.set_ylabel("tokens")
    left.set_title("hits per tier")
    left.legend()
    mib = 1024 * 1024
    right.bar(
        [i - w / 2 for i in x], [tiers[n]["bytes_read"] / mib for n in names], w, label="read"
    )
    right.bar(
        [i + w / 2 for i in x], [tiers[n]["bytes_written"] / mib for n in names], w, label="written"
    )
    right.set_xticks(list(x))
    right.set_xticklabels(names)
    right.set_ylabel("MiB")
    right.set_title("bytes moved per tier")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_predictions(report: RunReport, path: Path) -> Path:
    """Predicted vs actual seconds of each request's chosen path (load + prefill), log-log."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    colors = {"load": "#4f81bd", "partial": "#9bbb59", "recompute": "#c0504d", "miss": "#7f7f7f"}
    for action, color in colors.items():
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(report: RunReport, directory: Path) -> list[Path]:
    """Write every plot of a run into ``directory`` (created); the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [
        plot_ttft(report, directory / "run-ttft.png"),
        plot_tiers(report, directory / "run-tiers.png"),
        plot_predictions(report, directory / "run-predictions.png"),
    ]
