"""Rendering of a storage benchmark: a rich table, JSON text and an optional PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvtier.bench.storage import Measurement, StorageReport
from kvtier.specs import format_bytes


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _rate(tokens_per_s: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens_per_s >= size:
            return f"{tokens_per_s / size:.3g}{unit}"
    return f"{tokens_per_s:.3g}"


def _verdict(verdict: str | None) -> Text:
    if verdict is None:
        return Text("-", style="dim")
    return Text(verdict, style="bold green" if verdict == "PASS" else "bold red")


def _target(target: str | None, verdict: str | None) -> Text:
    if target is None:
        return Text("-", style="dim")
    text = Text(f"{target} ")
    text.append_text(_verdict(verdict))
    return text


def _row(m: Measurement) -> list:
    ref = m.reference
    lat = m.result.latency
    return [
        m.tier,
        m.op,
        str(m.depth),
        f"{m.request_blocks}",
        f"{m.result.gbps:.3f}",
        _ms(lat.p50),
        _ms(lat.p95),
        _ms(lat.p99),
        _rate(m.tokens_per_s),
        f"{ref.kind} {ref.result.gbps:.3f}" if ref else "-",
        f"{m.ratio:.2f}" if m.ratio is not None else "-",
        _target(f"≥{m.target:g}" if m.target is not None else None, m.verdict),
    ]


def storage_table(report: StorageReport) -> Group:
    """The results as a rich table, followed by the environment line and the notes."""
    cfg = report.config
    drives = sorted({m.drive for m in report.measurements})
    title = (
        f"kvtier bench storage: {format_bytes(cfg.block_bytes)} blocks "
        f"({cfg.model} × {cfg.chunk_tokens} tokens), {cfg.blocks} blocks per pass, "
        f"median of {cfg.repeats}, drive {'/'.join(drives) or '-'}; "
        "GB/s = 1e9 B/s of payload; latency per request of blk/req blocks"
    )
    table = Table(title=title, title_justify="left")
    left = ("tier", "op", "reference", "target")
    for name in (
        "tier",
        "op",
        "depth",
        "blk/req",
        "GB/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "tokens/s",
        "reference GB/s",
        "ratio",
        "target",
    ):
        table.add_column(name, justify="left" if name.split()[0] in left else "right")
    last = None
    for m in report.measurements:
        if last is not None and m.tier != last:
            table.add_section()
        last = m.tier
        table.add_row(*_row(m))
    trips = report.round_trips
    if trips:
        table.add_section()
    for t in trips:
        table.add_row(
            t.tier,
            "store+load",
            str(t.depth),
            "-",
            f"{t.gbps:.3f}",
            "-",
            "-",
            "-",
            "-",
            f"raw {t.reference_gbps:.3f}",
            f"{t.ratio:.2f}",
            _target(f"≥{t.target:g}" if t.target is not None else None, t.verdict),
        )
    if report.lookup is not None:
        lk = report.lookup
        table.add_section()
        table.add_row(
            "lookup",
            f"{lk.chunks} chunks",
            "-",
            "-",
            "-",
            _ms(lk.latency.p50),
            _ms(lk.latency.p95),
            _ms(lk.latency.p99),
            "-",
            "-",
            "-",
            _target(f"p50≤{lk.target_s * 1e3:g}ms", lk.verdict),
        )
    parts: list = [table]
    env = report.environment
    facts = [f"{env.cpus} CPUs", f"fio: {env.fio or 'not installed'}"]
    if env.directory:
        facts.append(f"disk dir {env.directory} ({env.filesystem}, O_DIRECT {env.o_direct})")
    parts.append(Text("; ".join(facts), style="dim"))
    parts += [Text(f"note: {n}", style="yellow") for n in report.notes]
    return Group(*parts)


def storage_json(report: StorageReport) -> str:
    """The report as indented JSON text."""
    return json.dumps(report.as_dict(), indent=2)


def storage_plot(report: StorageReport, path: str | Path) -> Path:
    """Bar charts of kvtier vs reference GB/s per tier and op over depth, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = list(dict.fromkeys(m.tier for m in report.measurements))
    ops = ["write", "read"]
    fig, axes = plt.subplots(
        len(tiers), len(ops), figsize=(5 * len(ops), 3 * max(1, len(tiers))), squeeze=False
    )
    for r, tier in enumerate(tiers):
        for c, op in enumerate(ops):
            ax = axes[r][c]
            rows = [m for m in report.measurements if m.tier == tier and m.op == op]
            xs = range(len(rows))
            ax.bar([x - 0.2 for x in xs], [m.result.gbps for m in rows], 0.4, label="kvtier")
            refs = [m.reference.result.gbps if m.reference else 0.0 for m in rows]
            if any(refs):
                kind = next(m.reference.kind for m in rows if m.reference)
                ax.bar([x + 0.2 for x in xs], refs, 0.4, label=kind)
            ax.set_xticks(list(xs), [f"depth {m.depth}" for m in rows])
            ax.set_title(f"{tier} {op}")
            ax.set_ylabel("GB/s")
            ax.legend()
    fig.suptitle(f"kvtier bench storage — {format_bytes(report.config.block_bytes)} blocks")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
