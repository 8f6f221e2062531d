"""``kvtier simulate``'s PNG plots (matplotlib, loaded only when a plot is asked for).

A run: TTFT over the run, and the GPU's time split. A sweep: the memory wall — hit shares per
tier and preemptions (where KV overflows engine memory), TTFT and the wait for KV (where
transfers dominate), and the GPU's time computing, waiting for KV and idle. A sweep of two
parameters: the same wall with one line per value of the second (a routing policy against the
replicas): the share of prompt tokens served from cache, TTFT, and goodput.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.sim.results import SimResult


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_run_plot(result: SimResult, path: Path) -> Path:
    """TTFT of each request against its send time, and the GPU's time split."""
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    done = [r for r in result.records if r.ttft_s is not None]
    a.scatter([r.sent_s for r in done], [r.ttft_s for r in done], s=6)
    a.set_xlabel("sent at (s)")
    a.set_ylabel("TTFT (s)")
    a.set_yscale("log")
    a.set_title("time to first token")
    gpu = result.summary["gpu_time"]
    shares = [gpu["compute_share"], gpu["kv_wait_share"], gpu["idle_share"]]
    b.bar(["computing", "waiting for KV", "idle"], shares, color=["C0", "C3", "C7"])
    b.set_ylim(0, 1)
    b.set_title("GPU time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_sweep_plot(name: str, rows: list[dict[str, Any]], path: Path) -> Path:
    """The memory-wall plot of a sweep (three panels)."""
    plt = _pyplot()
    labels = [str(r[name]) for r in rows]
    x = range(len(rows))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    tiers = sorted({t for r in rows for t in r["hit_rate"]})
    bottom = [0.0] * len(rows)
    for i, tier in enumerate(tiers):
        vals = [r["hit_rate"].get(tier, 0.0) for r in rows]
        axes[0].bar(x, vals, bottom=bottom, label=tier, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax2 = axes[0].twinx()
    ax2.plot(x, [r["preemptions"] for r in rows], "k.-", label="preemptions")
    ax2.set_ylabel("preemptions")
    axes[0].set_ylabel("share of prompt tokens served from")
    axes[0].set_title("where KV comes from (overflow)")
    axes[0].legend(loc="upper left", fontsize=8)
    axes[1].plot(x, [r["ttft_p50_s"] for r in rows], "o-", label="TTFT p50")
    axes[1].plot(x, [r["ttft_p95_s"] for r in rows], "o-", label="TTFT p95")
    axes[1].plot(x, [r["load_wait_p95_s"] for r in rows], "s--", label="KV load wait p95")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("seconds")
    axes[1].set_title("latency and the wait for KV (transfers)")
    axes[1].legend(fontsize=8)
    axes[2].stackplot(
        list(x),
        [r["compute_share"] for r in rows],
        [r["kv_wait_share"] for r in rows],
        [r["idle_share"] for r in rows],
        labels=["computing", "waiting for KV", "idle"],
        colors=["C0", "C3", "C7"],
    )
    axes[2].set_ylim(0, 1)
    axes[2].set_title("GPU time")
    axes[2].legend(loc="lower left", fontsize=8)
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels)
        ax.set_xlabel(name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_series_plot(name: str, series: str, rows: list[dict[str, Any]], path: Path) -> Path:
    """The memory wall of a two-parameter sweep: against ``name``'s values, one line per value
    of ``series`` — the share of prompt tokens served from cache (all sources solid, the
    engine's own dashed), TTFT p95 (solid) and p50 (dashed), and the share of requests within
    the SLO."""
    plt = _pyplot()
    labels = list(dict.fromkeys(str(r[name]) for r in rows))
    kinds = list(dict.fromkeys(str(r[series]) for r in rows))
    at = {label: i for i, label in enumerate(labels)}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for i, kind in enumerate(kinds):
        mine = [r for r in rows if str(r[series]) == kind]
        x = [at[str(r[name])] for r in mine]
        colour = f"C{i}"
        axes[0].plot(x, [r["hit_share"] for r in mine], "o-", color=colour, label=kind)
        engine = [r["hit_rate"].get("engine", 0.0) for r in mine]
        axes[0].plot(x, engine, ".--", color=colour)
        axes[1].plot(x, [r["ttft_p95_s"] for r in mine], "o-", color=colour, label=kind)
        axes[1].plot(x, [r["ttft_p50_s"] for r in mine], ".--", color=colour)
        axes[2].plot(x, [r["goodput_share"] for r in mine], "o-", color=colour, label=kind)
    axes[0].set_ylim(0, 1)
    axes[0].set_ylabel("share of prompt tokens served from cache")
    axes[0].set_title("hits: every source (solid), the engine's own (dashed)")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("seconds")
    axes[1].set_title("TTFT p95 (solid), p50 (dashed)")
    axes[2].set_ylim(0, 1)
    axes[2].set_ylabel("share of requests within the SLO")
    axes[2].set_title("goodput")
    for ax in axes:
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels)
        ax.set_xlabel(name)
        ax.legend(title=series, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["write_run_plot", "write_series_plot", "write_sweep_plot"]
