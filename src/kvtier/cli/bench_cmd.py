"""``kvtier bench …``: measured benchmarks, one sub-command each.

``storage`` lives here. To add another (``bench codec``, ``bench ttft`` …) either add a
function below and register it in ``make_bench_app``, or create a module
``kvtier/cli/bench_<name>_cmd.py`` with ``register_bench(bench: typer.Typer)``: such modules
are found and registered automatically. Keep heavy imports inside the command functions.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli.options import ChunkTokens, JsonOnStdout, MeasuredTiers, Strict
from kvtier.cli.values import int_list
from kvtier.errors import ConfigError

HELP = "Measured benchmarks: storage tiers against fio / memcpy, codecs, end-to-end TTFT."


def given_command(name: str) -> str:
    """``kvtier bench NAME`` with the arguments this process was given, for a report."""
    import shlex
    import sys

    return shlex.join(["kvtier", "bench", name, *sys.argv[3:]])


def parse_depths(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` → ``(1, 4, 16)``."""
    depths = int_list(text, f"cannot read depths {text!r}; write e.g. 1,4,16")
    if not depths or min(depths) < 1:
        raise ConfigError(f"depths must be positive integers, got {text!r}")
    return depths


def storage(
    tier: MeasuredTiers = None,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Directory of the default disk tier [./.kvtier/bench]."),
    ] = None,
    model: Annotated[str, typer.Option(help="Model preset whose KV shapes the blocks.")] = (
        "smollm2-135m"
    ),
    chunk_tokens: ChunkTokens = 256,
    block_size: Annotated[
        str | None, typer.Option(help="Block size override, e.g. 1MiB (instead of model × chunk).")
    ] = None,
    depth: Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")] = "1,4,16",
    data_size: Annotated[
        str, typer.Option(help="Bytes written and read back per tier and depth.")
    ] = "512MiB",
    batch: Annotated[
        int | None,
        typer.Option(
            help="Blocks per get_many_into/put_many request [1 per thread; native: the chunks "
            "of a 32k-token prefix, ≤ 256 MiB].",
            show_default=False,
        ),
    ] = None,
    drive: Annotated[
        str,
        typer.Option(
            help="auto: the tier's own I/O depth where it has one (disk), else threads; "
            "threads: DEPTH caller threads; native."
        ),
    ] = "auto",
    repeat: Annotated[
        int, typer.Option(help="Measure each depth this often, kvtier and reference alternating.")
    ] = 3,
    slices: Annotated[
        int,
        typer.Option(
            help="Cut each disk pass into up to this many slices, kvtier and fio taking turns "
            "slice by slice (a shared disk's speed drifts)."
        ),
    ] = 8,
    min_read_seconds: Annotated[
        float, typer.Option(help="Repeat read passes until they last this long (unsliced).")
    ] = 0.3,
    fio: Annotated[bool, typer.Option(help="Run fio as the disk reference when installed.")] = True,
    lookup: Annotated[
        bool, typer.Option(help="Time TieredCache.lookup of a long prefix (target ≤ 1 ms).")
    ] = True,
    lookup_chunks: Annotated[
        int, typer.Option(help="Chunks in the looked-up prefix (512 × 256 tokens = 128k).")
    ] = 512,
    payload: Annotated[
        str,
        typer.Option(
            help="random: random bytes; kv: real KV chunks of the embedded model (what a "
            "codec= tier compresses)."
        ),
    ] = "random",
    reference: Annotated[
        str,
        typer.Option(
            help="auto: fio for disk tiers, memcpy for memory, the stock client for shared "
            "tiers; raw: the same tier with codec=raw, taking turns with it slice by slice "
            "(what the tier's codec buys or costs)."
        ),
    ] = "auto",
    json_out: JsonOnStdout = False,
    plot: Annotated[Path | None, typer.Option(help="Save a PNG bar chart here.")] = None,
    strict: Strict = False,
) -> None:
    """Write then read KV-shaped blocks through each tier at several depths, next to fio/memcpy."""
    options = dict(locals())
    from rich.console import Console

    from kvtier.bench.report import storage_json, storage_plot, storage_table
    from kvtier.bench.storage import StorageBench, StorageBenchConfig, default_tier_urls
    from kvtier.cli.console import print_report, step_progress
    from kvtier.cli.values import config_from
    from kvtier.specs import parse_size
    from kvtier.tiers.paths import usable_directory, writable_file
    from kvtier.tiers.registry import check_tier_url

    if directory is not None:
        usable_directory(directory, "--dir", keep=False)
    if plot is not None:
        writable_file(plot, "--plot")
    size = parse_size(data_size)
    config = config_from(
        StorageBenchConfig,
        options,
        tiers=tuple(tier or default_tier_urls(directory, size)),
        block_size=parse_size(block_size) if block_size else None,
        depths=parse_depths(depth),
        data_size=size,
        repeats=repeat,
    )
    for url in config.tiers:  # before any tier is opened or data made
        check_tier_url(url)
    err = Console(stderr=True)
    # drawn between passes only (no auto refresh): no thread takes the GIL mid-pass
    with step_progress(err, auto_refresh=False) as progress:
        bench = StorageBench(config)
        task = progress.add_task("bench storage", total=bench.steps())

        def step(label: str) -> None:
            progress.update(task, advance=1, description=label)
            progress.refresh()

        bench.on_step = step
        report = bench.run()
    print_report(
        json_out, lambda: storage_json(report), lambda out: out.print(storage_table(report)), 140
    )
    if plot is not None:
        saved = storage_plot(report, plot)
        err.print(f"plot saved to {saved}")
    if strict and report.missed:
        err.print(f"missed targets: {', '.join(report.missed)}")
        raise typer.Exit(1)


def make_bench_app() -> typer.Typer:
    """The ``bench`` sub-app with every benchmark command registered."""
    bench = typer.Typer(name="bench", help=HELP, no_args_is_help=True)
    bench.command("storage")(storage)
    import kvtier.cli as cli_pkg

    for info in pkgutil.iter_modules(cli_pkg.__path__):
        if (
            info.name != "bench_cmd"
            and info.name.startswith("bench_")
            and info.name.endswith("_cmd")
        ):
            module = importlib.import_module(f"kvtier.cli.{info.name}")
            module.register_bench(bench)
    return bench


def register(cli: typer.Typer) -> None:
    """Add ``kvtier bench`` to the main app."""
    cli.add_typer(make_bench_app(), name="bench")
