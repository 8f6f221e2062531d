"""``kvtier bench codec``: kvtier's KV codec against raw, zstd, byte planes and zipnn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli.options import JsonOnStdout
from kvtier.cli.values import int_list, name_list
from kvtier.errors import ConfigError


def _ints(text: str, what: str) -> tuple[int, ...]:
    return int_list(text, f"cannot read {what} {text!r}; write e.g. 1,3", f"{what} is empty")


def _names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = name_list(text)
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ConfigError(f"{what} {text!r}: use some of {', '.join(allowed)}")
    return names


def codec(
    dtypes: Annotated[str, typer.Option(help="KV dtypes of the real corpus.")] = "bf16,fp16",
    kinds: Annotated[
        str, typer.Option(help="Prompt kinds of the real corpus.")
    ] = "prose,code,table,chat",
    lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens.")] = "1024,4096",
    per_prompt: Annotated[int, typer.Option(help="256-token chunks measured per prompt.")] = 1,
    zstd_levels: Annotated[str, typer.Option(help="zstd levels to compare.")] = "1,3",
    synthetic: Annotated[
        int, typer.Option(help="Blocks per synthetic corpus (synthetic bf16, random, fp16 noise).")
    ] = 4,
    real: Annotated[bool, typer.Option(help="Measure the real-KV corpus (the model's KV).")] = True,
    repeat: Annotated[int, typer.Option(help="Passes per speed; the best one counts.")] = 2,
    threads: Annotated[
        int | None, typer.Option(help="Threads for 'all cores' (default: every core).")
    ] = None,
    json_out: JsonOnStdout = False,
    plot: Annotated[Path | None, typer.Option(help="Save a PNG plot here.")] = None,
) -> None:
    """Ratio and speed of lossless codecs on real KV (256-token chunks) and synthetic data.

    The first run computes the real corpus with the embedded model (one fp32 forward per prompt,
    stored in each dtype; a minute or two) and keeps it in the kvtier cache folder; later runs
    read it back.
    """
    import os
    import time

    from rich.console import Console
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    from kvtier.bench.codec import CodecBenchConfig, run_codec_bench
    from kvtier.bench.codec_report import codec_json, codec_plot, codec_table
    from kvtier.cli.console import print_report
    from kvtier.engines.kv_corpus import KINDS
    from kvtier.tiers.paths import writable_file

    if plot is not None:
        writable_file(plot, "--plot")
    if per_prompt < 1:
        raise ConfigError(f"--per-prompt must be at least 1, got {per_prompt}")
    config = CodecBenchConfig(
        dtypes=_names(dtypes, ("bf16", "fp16"), "--dtypes"),
        kinds=_names(kinds, KINDS, "--kinds"),
        lengths=_ints(lengths, "--lengths"),
        per_prompt=per_prompt,
        zstd_levels=_ints(zstd_levels, "--zstd-levels"),
        synthetic_blocks=synthetic,
        real=real,
        repeats=repeat,
        threads=threads or os.cpu_count() or 1,
    )
    if min(config.lengths) < 256:
        raise ConfigError(f"--lengths must be at least one 256-token chunk, got {lengths!r}")
    err = Console(stderr=True)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("bench codec")
        started = time.monotonic()

        def step(label: str) -> None:
            if err.is_terminal:
                progress.update(task, description=label)
            else:  # a log or a pipe: one line a step (a live bar would print nothing there)
                err.print(f"[{time.monotonic() - started:5.0f} s] {label}", highlight=False)

        report = run_codec_bench(config, on_step=step)
    print_report(
        json_out, lambda: codec_json(report), lambda out: out.print(codec_table(report)), 130
    )
    if plot is not None:
        err.print(f"plot saved to {codec_plot(report, plot)}")


def register_bench(bench: typer.Typer) -> None:
    """Add ``codec`` to ``kvtier bench``."""
    bench.command("codec")(codec)
