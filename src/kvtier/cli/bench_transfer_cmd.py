"""``kvtier bench transfer``: the transfer engine on a model's paged KV, CPU or CUDA."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli.options import JsonOnStdout
from kvtier.cli.values import name_list


def transfer(
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    model: Annotated[str, typer.Option(help="Model preset whose KV geometry the pool has.")] = (
        "llama-3.1-8b"
    ),
    layout: Annotated[
        str, typer.Option(help="vLLM KV layout: LBNHC, LBHNC, BLNHC, BLHNC, BHLNC or LHBNC.")
    ] = "LBNHC",
    block_size: Annotated[int, typer.Option(help="Tokens per vLLM block.")] = 16,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per kvtier chunk.")] = 256,
    tokens: Annotated[
        int | None,
        typer.Option(
            help="Tokens moved per measurement (cpu: 2048, cuda: 8192).", show_default=False
        ),
    ] = None,
    tiers: Annotated[str, typer.Option(help="Round-trip tiers: memory, slab, file.")] = (
        "memory,slab,file"
    ),
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Disk tiers go here (default: the temp folder).")
    ] = None,
    repeat: Annotated[int, typer.Option(help="Timed runs per figure (the median counts).")] = 5,
    staging: Annotated[
        str, typer.Option(help="The pinned staging ring on CUDA (at least one chunk).")
    ] = "512MiB",
    json_out: JsonOnStdout = False,
) -> None:
    """Move whole blocks between a paged KV pool and kvtier's tiers, bit-exact, and time the
    engine's copies against a plain copy and a load beside a stand-in forward.
    """
    import json
    from datetime import UTC, datetime

    from rich.console import Console

    from kvtier.bench.transfer import TransferBenchConfig, run_transfer_bench
    from kvtier.bench.transfer_report import render_transfer, transfer_document
    from kvtier.cli.bench_cmd import given_command
    from kvtier.cli.console import print_report, step_progress
    from kvtier.specs.units import parse_size
    from kvtier.tiers.paths import usable_directory

    if directory is not None:
        directory = usable_directory(directory, "--dir", keep=True)
    config = TransferBenchConfig(
        model=model,
        device=device,
        layout=layout.upper(),
        block_size=block_size,
        chunk_tokens=chunk_tokens,
        tokens=tokens or (2048 if device == "cpu" else 8192),
        tiers=name_list(tiers),
        directory=directory,
        repeats=repeat,
        ring_bytes=parse_size(staging),
    )
    err = Console(stderr=True)
    with step_progress(err) as progress:
        task = progress.add_task("bench transfer", total=len(config.tiers) + 5)
        report = run_transfer_bench(
            config, lambda label: progress.update(task, advance=1, description=label)
        )
    doc = transfer_document(report, given_command("transfer"), datetime.now(UTC).date().isoformat())
    print_report(
        json_out, lambda: json.dumps(doc, indent=2), lambda out: render_transfer(report, out)
    )


def register_bench(bench: typer.Typer) -> None:
    """Add ``transfer`` to ``kvtier bench``."""
    bench.command("transfer")(transfer)
