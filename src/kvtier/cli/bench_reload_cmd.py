"""``kvtier bench reload``: TTFT of prompts kvtier holds (after a restart, or prefilled by a
producer engine) against the same engine recomputing.

Found and registered by :func:`kvtier.cli.bench_cmd.make_bench_app` (``register_bench``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli.options import JsonOnStdout, Strict


def reload(
    mode: Annotated[
        str,
        typer.Option(
            help="restart: a new engine loads what the last stored on disk; pd: a decode "
            "engine loads what a prefill engine stored in a shared tier."
        ),
    ] = "restart",
    tp: Annotated[int, typer.Option(help="Tensor-parallel ranks per engine.")] = 1,
    prompts: Annotated[int, typer.Option(help="Held prompts (and as many fresh ones).")] = 4,
    prompt_tokens: Annotated[int, typer.Option(help="Tokens per prompt.")] = 4160,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per kvtier chunk.")] = 256,
    shared: Annotated[
        str | None,
        typer.Option(
            help="--mode pd: the shared tier's URL (default: a disk directory both open)."
        ),
    ] = None,
    directory: Annotated[
        Path, typer.Option("--dir", help="Logs, records and the disk tiers.")
    ] = Path(".kvtier/bench-reload"),
    seed: Annotated[int, typer.Option(help="Seed of the prompts.")] = 0,
    json_out: JsonOnStdout = False,
    strict: Strict = False,
) -> None:
    """TTFT of held prompts against recomputing them, on real vLLM engines with kvtier."""
    options = dict(locals())
    import json
    from datetime import UTC, datetime

    from rich.console import Console

    from kvtier.bench.env import BenchEnvironment
    from kvtier.bench.reload import ReloadBench, ReloadConfig, render
    from kvtier.cli.bench_cmd import given_command
    from kvtier.cli.console import print_report, step_progress
    from kvtier.cli.values import config_from
    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.tiers.paths import usable_directory
    from kvtier.tiers.registry import check_tier_url, open_tier

    directory = usable_directory(directory, "--dir", keep=True)
    config = config_from(ReloadConfig, options, directory=directory)
    if shared is not None:  # refused now, in one line, rather than by both engines' start-up
        check_tier_url(shared)
        open_tier(shared, b"kvtier-bench-chk").close()
    folder, _, _ = embedded_model_folder()
    err = Console(stderr=True)
    with step_progress(err) as progress:
        bench = ReloadBench(config, folder)
        task = progress.add_task("bench reload", total=bench.steps())
        bench.on_step = lambda label: progress.update(task, advance=1, description=label)
        report = bench.run()
    data = {
        "schema": "kvtier.bench.reload/1",
        "date": datetime.now(UTC).date().isoformat(),
        "command": given_command("reload"),
        **report.to_dict(),
        "environment": BenchEnvironment.probe(directory, None).as_dict(),
    }
    print_report(json_out, lambda: json.dumps(data, indent=2), lambda out: render(report, out))
    if strict and data["passed"] is False:
        raise typer.Exit(1)


def register_bench(bench: typer.Typer) -> None:
    """Add ``reload`` to the ``kvtier bench`` sub-app."""
    bench.command("reload")(reload)
