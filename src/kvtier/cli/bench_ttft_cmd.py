"""``kvtier bench ttft``: time to first token with kvtier vs recompute, against issue #4's targets.

Found and registered by :func:`kvtier.cli.bench_cmd.make_bench_app` (``register_bench``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kvtier.errors import ConfigError


def _lengths(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ConfigError(f"--lengths: cannot read {text!r}; write e.g. 64,256,1024") from None
    if not out:
        raise ConfigError("--lengths needs at least one prefix length")
    return out


def ttft(
    model: Annotated[
        str, typer.Option("--model", "-m", help="embedded (SmolLM2-135M), .gguf, folder or hub id.")
    ] = "embedded",
    dtype: Annotated[str, typer.Option(help="Model (and KV) dtype: bf16, fp16 or fp32.")] = "bf16",
    device: Annotated[
        str | None, typer.Option(help="Torch device (default: cuda when available, else cpu).")
    ] = None,
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
    profile: Annotated[
        Path | None, typer.Option(help="Calibration profile (default: `kvtier calibrate`'s).")
    ] = None,
    calibrate: Annotated[
        bool, typer.Option("--calibrate", help="Measure a profile now, even if one fits.")
    ] = False,
    guard: Annotated[
        bool,
        typer.Option(
            help="Time only while a canary forward runs at its usual speed; rerun measurements "
            "that other work disturbed."
        ),
    ] = True,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Prefill in chunk-aligned forwards, with and without kvtier (bit-identical "
            "logits); the default runs one forward over the new tokens.",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
    strict: Annotated[bool, typer.Option(help="Exit 1 when any target is missed.")] = False,
) -> None:
    """Sweep prefix lengths × tiers (recompute vs load vs the decision), reuse and miss TTFT."""
    import json

    from rich.console import Console

    from kvtier.cli.console import step_progress, table_console

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kvtier.bench.ttft import TTFTBench, TTFTBenchConfig, render
    from kvtier.tiers.paths import usable_directory
    from kvtier.tiers.registry import check_tier_url

    usable_directory(directory, "--dir", keep=False)  # before the model loads

    config = TTFTBenchConfig(
        model=model,
        dtype=dtype,
        device=device,
        lengths=_lengths(lengths),
        chunk_tokens=chunk_tokens,
        new_tokens=new_tokens,
        directory=directory,
        repeats=repeats,
        miss_tokens=miss_tokens,
        miss_pairs=miss_pairs,
        profile_path=profile,
        calibrate=calibrate,
        guard=guard,
        exact=exact,
    )
    for url, _ in config.tier_urls():
        check_tier_url(url)
    err = Console(stderr=True)
    with step_progress(err) as progress:
        bench = TTFTBench(config)
        task = progress.add_task("bench ttft", total=bench.steps())
        bench.on_step = lambda label: progress.update(task, advance=1, description=label)
        report = bench.run()
    if json_out:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        out = table_console()
        render(report, out)
    if strict and any(t.passed is False for t in report.targets()):
        raise typer.Exit(1)


def register_bench(bench: typer.Typer) -> None:
    """Add ``ttft`` to the ``kvtier bench`` sub-app."""
    bench.command("ttft")(ttft)
