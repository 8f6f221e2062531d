"""The codec benchmark's table, JSON and plot."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvtier.bench.codec import CodecReport, Result


def _reference(results: list[Result], corpus: str, method: str) -> Result | None:
    return next((r for r in results if r.corpus == corpus and r.method == method), None)


def ratios_against(report: CodecReport, method: str = "kvtier-kv") -> dict[str, dict[str, float]]:
    """Per corpus: ``method``'s ratio and speeds divided by zstd-1's and zipnn's (same run)."""
    out: dict[str, dict[str, float]] = {}
    for corpus in dict.fromkeys(r.corpus for r in report.results):
        mine = _reference(report.results, corpus, method)
        if mine is None:
            continue
        row: dict[str, float] = {}
        for ref in ("zstd-1", "zipnn"):
            other = _reference(report.results, corpus, ref)
            if other is None:
                continue
            row[f"ratio/{ref}"] = mine.ratio / other.ratio
            row[f"encode/{ref}"] = mine.encode_gbps_core / other.encode_gbps_core
            row[f"decode/{ref}"] = mine.decode_gbps_core / other.decode_gbps_core
        out[corpus] = row
    return out


def codec_table(report: CodecReport) -> Group:
    """One table row per corpus × method, then kvtier's codec against the references."""
    table = Table(
        title=f"bench codec — {report.cpu}, {report.cores} cores, "
        f"load {report.load[0]:.1f} (speeds on a shared machine are noisy)"
    )
    for col in ("corpus", "method", "raw MB", "ratio", "enc GB/s", "dec GB/s"):
        table.add_column(col, justify="left" if col in ("corpus", "method") else "right")
    table.add_column(f"enc ×{report.cores}", justify="right")
    table.add_column(f"dec ×{report.cores}", justify="right")
    table.add_column("exact")
    for r in report.results:
        table.add_row(
            r.corpus,
            r.method,
            f"{r.raw_bytes / 1e6:.0f}",
            f"{r.ratio:.3f}",
            f"{r.encode_gbps_core:.3f}",
            f"{r.decode_gbps_core:.3f}",
            f"{r.encode_gbps_all:.3f}",
            f"{r.decode_gbps_all:.3f}",
            Text("yes", "green") if r.exact else Text("NO", "bold red"),
        )
    lines = []
    for corpus, row in ratios_against(report).items():
        parts = ", ".join(f"{k} {v:.2f}×" for k, v in row.items())
        lines.append(Text(f"kvtier-kv on {corpus}: {parts}"))
    return Group(table, *lines)


def codec_json(report: CodecReport) -> str:
    """The report as JSON (results, machine, and kvtier's codec against zstd-1 and zipnn)."""
    data = asdict(report)
    data["against"] = ratios_against(report)
    return json.dumps(data, indent=2)


def codec_plot(report: CodecReport, path: str | Path) -> Path:
    """Ratio and per-core decode speed per corpus and method, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    corpora = list(dict.fromkeys(r.corpus for r in report.results))
    names = list(dict.fromkeys(r.method for r in report.results))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / max(1, len(names))
    x = np.arange(len(corpora))
    for i, name in enumerate(names):
        rows = [_reference(report.results, c, name) for c in corpora]
        ratio = [r.ratio if r else 0 for r in rows]
        dec = [r.decode_gbps_core if r else 0 for r in rows]
        axes[0].bar(x + i * width, ratio, width, label=name)
        axes[1].bar(x + i * width, dec, width, label=name)
    for ax, title in zip(axes, ("ratio (raw / stored)", "decode GB/s per core"), strict=True):
        ax.set_xticks(x + width * (len(names) - 1) / 2, corpora, rotation=20, fontsize=8)
        ax.set_title(title)
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"kvtier bench codec — {report.cpu}", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


__all__ = ["codec_json", "codec_plot", "codec_table", "ratios_against"]
