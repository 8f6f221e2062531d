"""``kvtier bench ttft``: time to first token with kvtier vs recompute, against issue #4's targets.

Found and registered by :func:`kvtier.cli.bench_cmd.make_bench_app` (``register_bench``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli.options import (
    CalibrationFile,
    EmbeddedModel,
    ExactPrefill,
    JsonOnStdout,
    ModelDtype,
    Recalibrate,
    Strict,
    TorchDevice,
)
from kvtier.cli.values import int_list


def _lengths(text: str) -> tuple[int, ...]:
    return int_list(
        text,
        f"--lengths: cannot read {text!r}; write e.g. 64,256,1024",
        "--lengths needs at least one prefix length",
    )


def ttft(
    model: EmbeddedModel = "embedded",
    dtype: ModelDtype = "bf16",
    device: TorchDevice = None,
    lengths: Annotated[
        str, typer.Option(help="Prefix lengths of the sweep, comma-separated (tokens).")
    ] = "64,128,256,512,1024,2048,4096,8192",
    chunk_tokens: Annotated[
        int,
        typer.Option(help="Tokens per KV chunk; every prefix length should be a multiple."),
    ] = 64,
    new_tokens: Annotated[int, typer.Option(help="Prompt tokens after the prefix.")] = 32,
    repeats: Annotated[
        int, typer.Option(help="Runs per measurement (the fastest counts); 1 for long prefills.")
    ] = 3,
    miss_tokens: Annotated[int, typer.Option(help="Tokens of each cold (miss) prompt.")] = 256,
    miss_pairs: Annotated[
        int, typer.Option(help="Cold prompts, each run with and without kvtier.")
    ] = 10,
    directory: Annotated[Path, typer.Option("--dir", help="Directory of the disk tier.")] = Path(
        ".kvtier/bench-ttft"
    ),
    profile: CalibrationFile = None,
    calibrate: Recalibrate = False,
    guard: Annotated[
        bool,
        typer.Option(
            help="Time only while a canary forward runs at its usual speed; rerun measurements "
            "that other work disturbed."
        ),
    ] = True,
    exact: ExactPrefill = False,
    json_out: JsonOnStdout = False,
    strict: Strict = False,
) -> None:
    """Sweep prefix lengths × tiers (recompute vs load vs the decision), reuse and miss TTFT."""
    options = dict(locals())
    import json

    from rich.console import Console

    from kvtier.cli.console import print_report, step_progress
    from kvtier.cli.values import config_from

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kvtier.bench.ttft import TTFTBench, TTFTBenchConfig, render
    from kvtier.tiers.paths import usable_directory
    from kvtier.tiers.registry import check_tier_url

    usable_directory(directory, "--dir", keep=False)  # before the model loads

    config = config_from(TTFTBenchConfig, options, lengths=_lengths(lengths), profile_path=profile)
    for url, _ in config.tier_urls():
        check_tier_url(url)
    err = Console(stderr=True)
    with step_progress(err) as progress:
        bench = TTFTBench(config)
        task = progress.add_task("bench ttft", total=bench.steps())
        bench.on_step = lambda label: progress.update(task, advance=1, description=label)
        report = bench.run()
    print_report(
        json_out, lambda: json.dumps(report.to_dict(), indent=2), lambda out: render(report, out)
    )
    if strict and any(t.passed is False for t in report.targets()):
        raise typer.Exit(1)


def register_bench(bench: typer.Typer) -> None:
    """Add ``ttft`` to the ``kvtier bench`` sub-app."""
    bench.command("ttft")(ttft)
