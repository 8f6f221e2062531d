"""``kvtier bench mlperf``: MLPerf Storage's KV-cache workload on kvtier's disk tier and on the
benchmark's own file backend, on the same directory, in one run.

Found and registered by :func:`kvtier.cli.bench_cmd.make_bench_app` (``register_bench``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

TARGET = 1.0  # kvtier's read bandwidth over the benchmark's file backend's, at least


def mlperf(
    tool: Annotated[
        Path,
        typer.Option(help="MLPerf Storage's kv-cache.py (e.g. ../shared/tools/mlperf-kv-cache)."),
    ],
    directory: Annotated[
        Path,
        typer.Option("--dir", help="A directory on the disk under test (both sides use it)."),
    ],
    model: Annotated[str, typer.Option(help="The benchmark's model (its --model).")] = "tiny-1b",
    users: Annotated[int, typer.Option(help="The benchmark's --num-users.")] = 4,
    duration: Annotated[int, typer.Option(help="The benchmark's --duration, seconds.")] = 15,
    max_requests: Annotated[int, typer.Option(help="The benchmark's --max-requests.")] = 40,
    seed: Annotated[int, typer.Option(help="The benchmark's --seed.")] = 1,
    tier: Annotated[
        list[str] | None,
        typer.Option(help="kvtier's tier stack (default: one slab:// tier in --dir)."),
    ] = None,
    chunk_size: Annotated[str, typer.Option(help="kvtier's chunk size.")] = "4MiB",
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """MLPerf's KV-cache benchmark on its own file backend in --dir, then the objects it
    stored written and read back through kvtier's tiers there: read GB/s per object, P50/P95."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from kvtier.bench.mlperf_ref import (
        MlperfWorkload,
        check_tool,
        objects_of,
        replay_ops,
        run_file_backend,
    )
    from kvtier.bench.stats import LatencyStats
    from kvtier.bench.trace import TraceConfig, replay
    from kvtier.specs import format_bytes, parse_size
    from kvtier.tiers.paths import usable_directory
    from kvtier.tiers.registry import check_tier_url

    tool = check_tool(tool)
    workload = MlperfWorkload(model, users, duration, max_requests, seed)
    directory = usable_directory(directory, "--dir")
    chunk = parse_size(chunk_size)
    for url in tier or ():
        check_tier_url(url)
    err = Console(stderr=True)
    work = Path(tempfile.mkdtemp(prefix="kvtier-mlperf-"))
    files = directory / f"mlperf-{work.name}"
    slab = directory / f"kvtier-{work.name}"
    try:
        with Progress(console=err, transient=True) as progress:
            step = progress.add_task("kv-cache.py: its file backend on --dir", total=None)
            reference = run_file_backend(tool, workload, files, work)
            ops = replay_ops(objects_of(files), reference.reads)
            shutil.rmtree(files, ignore_errors=True)
            written = sum(op.size for op in ops if op.op == "write")
            size = f"{(2 * written >> 20) + 256}MiB"
            tiers = tuple(tier or (f"slab://{slab}?size={size}",))
            config = TraceConfig(tiers=tiers, chunk_bytes=chunk, bytes_per_token=1)
            progress.update(step, description="kvtier: the same objects", total=len(ops))
            report = replay(ops, config, on_op=lambda: progress.advance(step))
    finally:
        shutil.rmtree(files, ignore_errors=True)
        shutil.rmtree(slab, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    lat = LatencyStats.from_samples(report.read_latency)
    mean = report.read_bytes / report.reads if report.reads else 0.0
    ours = mean / lat.p50 / 1e9 if lat.p50 else 0.0
    ratio = ours / reference.read_gbps_p50 if reference.read_gbps_p50 else 0.0
    figures = {
        "workload": workload.args(),
        "directory": str(directory),
        "tiers": list(tiers),
        "reference": reference.as_dict(),
        "kvtier": report.as_dict() | {"read_gbps_p50": ours},
        "read_ratio": ratio,
        "target": TARGET,
        "passed": ratio >= TARGET,
    }
    if json_out:
        typer.echo(json.dumps(figures, indent=2))
        return
    table = Table(
        title=f"kvtier bench mlperf: {model}, {users} users, {len(ops) - report.reads} objects, "
        f"from {directory}"
    )
    for column in ("side", "reads", "bytes per read", "read GB/s (object/p50)", "p50 ms", "p95 ms"):
        table.add_column(column, justify="right")
    table.add_row(
        "kv-cache.py file backend",
        str(reference.reads),
        format_bytes(reference.mean_read_bytes),
        f"{reference.read_gbps_p50:.3f}",
        f"{reference.read_p50_ms:.1f}",
        f"{reference.read_p95_ms:.1f}",
    )
    table.add_row(
        "kvtier " + " → ".join(t.split(":")[0] for t in tiers),
        str(report.reads),
        format_bytes(mean),
        f"{ours:.3f}",
        f"{lat.p50 * 1e3:.1f}",
        f"{lat.p95 * 1e3:.1f}",
    )
    console = Console()
    console.print(table)
    verdict = "PASS" if ratio >= TARGET else "MISS"
    console.print(f"read ratio kvtier / kv-cache.py: {ratio:.2f} (target ≥ {TARGET}: {verdict})")


def register_bench(bench: typer.Typer) -> None:
    """Add ``kvtier bench mlperf``."""
    bench.command("mlperf")(mlperf)
