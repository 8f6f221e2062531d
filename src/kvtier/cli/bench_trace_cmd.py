"""``kvtier bench trace``: an MLPerf KV-cache I/O trace replayed through kvtier tiers.

Found and registered by :func:`kvtier.cli.bench_cmd.make_bench_app` (``register_bench``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def trace(
    trace_file: Annotated[
        Path, typer.Option("--trace", help="The trace: kv-cache.py --io-trace-log FILE.csv.")
    ],
    tier: Annotated[
        list[str],
        typer.Option("--tier", help="Tier URL of the stack, fast→slow (repeatable)."),
    ],
    chunk_size: Annotated[
        str, typer.Option(help="Objects are cut into chunks of this size.")
    ] = "4MiB",
    model: Annotated[
        str, typer.Option(help="Model preset whose KV bytes per token give tokens/s.")
    ] = "smollm2-135m",
    bytes_per_token: Annotated[
        int | None,
        typer.Option(help="KV bytes per token (instead of --model; tiny-1b: 24576)."),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Replay only the first N operations.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Replay an MLPerf KV-cache trace through a tier stack: GB/s, P95 latency, tokens/s, hits."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from kvtier.bench.trace import TraceConfig, replay
    from kvtier.specs import parse_size
    from kvtier.tiers.registry import check_tier_url
    from kvtier.workloads.mlperf import read_trace

    config = TraceConfig(
        tiers=tuple(tier),
        chunk_bytes=parse_size(chunk_size),
        model=model,
        bytes_per_token=bytes_per_token,
        limit=limit,
    )
    config.token_bytes  # noqa: B018 - an unknown model is refused before any I/O
    for url in config.tiers:
        check_tier_url(url)
    ops = read_trace(trace_file)
    todo = len(ops[: config.limit] if config.limit else ops)
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("bench trace", total=todo)
        report = replay(ops, config, on_op=lambda: progress.advance(task))
    figures = report.as_dict()
    if json_out:
        typer.echo(json.dumps(figures, indent=2))
        return
    table = Table(title=f"kvtier bench trace: {trace_file.name} through {' → '.join(tier)}")
    for column in ("op", "count", "GB/s", "p50 ms", "p95 ms", "tokens/s", "hit rate"):
        table.add_column(column, justify="right")
    for op in ("read", "write"):
        lat = figures[f"{op}_latency"]
        table.add_row(
            op,
            str(figures[f"{op}s"]),
            f"{figures[f'{op}_gbps']:.3f}",
            f"{lat['p50'] * 1e3:.1f}",
            f"{lat['p95'] * 1e3:.1f}",
            f"{figures['read_tokens_per_s']:.0f}" if op == "read" else "",
            f"{figures['hit_rate']:.1%}" if op == "read" else "",
        )
    Console().print(table)


def register_bench(bench: typer.Typer) -> None:
    """Add ``kvtier bench trace``."""
    bench.command("trace")(trace)
