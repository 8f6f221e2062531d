"""``kvtier bench transfer``'s report: its JSON document and its tables."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtier.bench.transfer import TransferReport

#: Share of a plain copy's speed the engine's copies are held to on CUDA.
COPY_TARGET = 0.9
#: The most a concurrent full load may slow the stand-in forward on CUDA.
SLOWDOWN_TARGET = 0.10


def transfer_document(report: TransferReport, command: str, date: str) -> dict[str, Any]:
    """The report as ``--json`` prints it, with the targets it was held to (on CUDA)."""
    doc: dict[str, Any] = {
        "schema": "kvtier.bench.transfer/1",
        "date": date,
        "command": command,
        **asdict(report),
    }
    exact = all(r["exact"] for r in report.round_trips) and report.file_io.get("exact", True)
    doc["targets"] = {"round_trips_exact": exact}
    if report.config["device"] != "cpu":
        doc["targets"].update(
            {
                "copies_at_least_share": COPY_TARGET,
                "copies_met": all(
                    report.copies[k]["share_of_plain"] >= COPY_TARGET
                    for k in ("to_host", "to_device")
                ),
                "slowdown_at_most": SLOWDOWN_TARGET,
                "slowdown_met": report.overlap["slowdown"] <= SLOWDOWN_TARGET,
            }
        )
    return doc


def render_transfer(report: TransferReport, out: Console) -> None:
    """The three tables: round trips, copies, overlap."""
    c = report.config
    out.print(
        f"[bold]{c['model']}[/] paged KV, {c['layout']}, {c['block_size']}-token blocks, "
        f"{c['chunk_tokens']}-token chunks of {report.chunk_bytes / 2**20:.1f} MiB, "
        f"on {c['device']} ({report.device_name})"
    )
    trips = Table(title="round trips (gather → tier → scatter elsewhere)")
    for col in ("tier", "chunks", "stored", "read", "bit-exact", "seconds"):
        trips.add_column(col, justify="right")
    for r in report.round_trips:
        trips.add_row(
            r["tier"], str(r["chunks"]), str(r["stored"]), str(r["read"]),
            "yes" if r["exact"] else "[red]NO[/]", f"{r['seconds']:.2f}",
        )  # fmt: skip
    out.print(trips)
    copies = Table(title="copies: the engine against a plain copy of the same bytes")
    for col in ("direction", "MiB", "engine GB/s", "plain GB/s", "share of plain"):
        copies.add_column(col, justify="right")
    for name, r in report.copies.items():
        copies.add_row(
            name, f"{r['bytes'] / 2**20:.0f}", f"{r['engine_gbps']:.2f}",
            f"{r['plain_gbps']:.2f}", f"{r['share_of_plain']:.2f}×",
        )  # fmt: skip
    out.print(copies)
    o = report.overlap
    lap = Table(title="a load beside a stand-in forward")
    lap.add_column("figure")
    lap.add_column("value", justify="right")
    rows = [
        ("chunks loaded", str(o["chunks"])),
        ("load alone (layer by layer)", f"{o['load_s'] * 1e3:.1f} ms"),
        ("stand-in forward alone", f"{o['forward_alone_s'] * 1e3:.1f} ms"),
        ("forward beside a full load", f"{o['forward_beside_load_s'] * 1e3:.1f} ms"),
        ("forward slowed by", f"{o['slowdown'] * 100:.1f} %"),
        ("first layer usable after", f"{o['first_layer_usable_s'] * 1e3:.1f} ms"),
        ("last layer usable after", f"{o['last_layer_usable_s'] * 1e3:.1f} ms"),
        ("load + forward, per layer", f"{o['total_layerwise_s'] * 1e3:.1f} ms"),
        ("load + forward, whole load first", f"{o['total_whole_s'] * 1e3:.1f} ms"),
    ]
    for row in rows:
        lap.add_row(*row)
    out.print(lap)
    gds = report.gds
    out.print(
        "GPUDirect Storage: "
        + (f"kvikio, compat mode {gds['compat_mode']}" if gds.get("available") else gds["reason"])
    )
    f = report.file_io
    if "skipped" in f:
        out.print(f"file reads and writes, staged and straight: skipped ({f['skipped']})")
        return
    files = Table(
        title=f"file:// tier, {f['chunks']} chunks: through host memory (staged) and straight "
        f"({f['library']}, compat mode {f['compat_mode']})"
    )
    for col in ("direction", "staged GB/s", "straight GB/s", "straight ÷ staged"):
        files.add_column(col, justify="right")
    for way in ("read", "write"):
        staged, straight = f[f"{way}_staged_gbps"], f[f"{way}_straight_gbps"]
        files.add_row(way, f"{staged:.2f}", f"{straight:.2f}", f"{straight / staged:.2f}×")
    out.print(files)
    out.print("bit-exact both ways: " + ("yes" if f["exact"] else "[red]NO[/]"))


__all__ = ["COPY_TARGET", "SLOWDOWN_TARGET", "render_transfer", "transfer_document"]
