"""PNG plots of a vLLM run: TTFT by system, where prompt tokens came from, TTFT over time."""

from __future__ import annotations

from pathlib import Path

from kvtier.job.vllm_report import ENGINE_TIER, VllmRunReport

COLORS = {"vllm": "#c0504d", "vllm+kvtier": "#4f81bd", "vllm+kvtier+codec": "#9bbb59"}
SOURCE_COLORS = {
    "computed": "#bbbbbb",
    ENGINE_TIER: "#9bbb59",
    "dram": "#4f81bd",
    "disk": "#8064a2",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(report: VllmRunReport) -> str:
    return f"{report.model.get('model_id')}\n{report.machine.get('cpu')}"


def _seconds_axis(axis) -> None:
    """A log axis of seconds labelled 0.5, 1, 2, 10 … rather than powers of ten."""
    from matplotlib.ticker import FormatStrFormatter

    axis.set_major_formatter(FormatStrFormatter("%g"))
    axis.set_minor_formatter(FormatStrFormatter(""))


def plot_ttft(report: VllmRunReport, path: Path) -> Path:
    """Left: TTFT distribution (CDF) per system; right: TTFT against prompt length."""
    plt = _pyplot()
    fig, (cdf, scatter) = plt.subplots(1, 2, figsize=(10, 4))
    for phase in report.phases:
        ttft = sorted(r.ttft_s for r in phase.requests)
        n = len(ttft)
        color = COLORS.get(phase.system)
        cdf.step(ttft, [(i + 1) / n for i in range(n)], where="post", label=phase.system, c=color)
        scatter.scatter(
            [r.prompt_tokens for r in phase.requests],
            [r.ttft_s for r in phase.requests],
            s=14,
            label=phase.system,
            c=color,
            alpha=0.8,
        )
    cdf.set_xscale("log")
    _seconds_axis(cdf.xaxis)
    cdf.set_xlabel("time to first token (s)")
    cdf.set_ylabel("share of requests")
    cdf.legend(fontsize=8)
    scatter.set_yscale("log")
    _seconds_axis(scatter.yaxis)
    scatter.set_xlabel("prompt tokens")
    scatter.set_ylabel("time to first token (s)")
    fig.suptitle(f"time to first token: {_title(report)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sources(report: VllmRunReport, path: Path) -> Path:
    """Stacked bars per system: prompt tokens computed, found in vLLM's pool, in each tier."""
    plt = _pyplot()
    systems = report.summary()["systems"]
    names = list(systems)
    order = list(SOURCE_COLORS)
    tiers = {t for s in systems.values() for t in s["hit_tokens"]}
    sources = ["computed", *sorted(tiers, key=lambda t: (order.index(t) if t in order else 9, t))]
    fig, ax = plt.subplots(figsize=(7, 4.2))
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(report: VllmRunReport, path: Path) -> Path:
    """TTFT of each request at the time it was sent, per system."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for phase in report.phases:
        ax.scatter(
            [r.sent_s for r in phase.requests],
            [r.ttft_s for r in phase.requests],
            s=14,
            label=phase.system,
            c=COLORS.get(phase.system),
        )
    ax.set_yscale("log")
    _seconds_axis(ax.yaxis)
    ax.set_xlabel("seconds into the phase (request sent)")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(f"TTFT over the run: {_title(report)}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(report: VllmRunReport, directory: Path) -> list[Path]:
    """Write every plot of a vLLM run into ``directory`` (created); the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [
        plot_ttft(report, directory / "run-vllm-ttft.png"),
        plot_sources(report, directory / "run-vllm-sources.png"),
        plot_timeline(report, directory / "run-vllm-timeline.png"),
    ]


__all__ = ["plot_sources", "plot_timeline", "plot_ttft", "write_plots"]
