"""``kvtier run``: the main job — a realistic workload through a real model, kvtier vs recompute.

torch/transformers are imported inside the command, so other commands stay fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvtier.workloads.sessions import WorkloadSpec

if TYPE_CHECKING:
    from kvtier.run.job import RunConfig

_W = WorkloadSpec()


def run_command(
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="embedded (SmolLM2-135M), a .gguf file, a local folder or hub id."
        ),
    ] = "embedded",
    dtype: Annotated[str, typer.Option(help="Model (and KV) dtype: bf16, fp16 or fp32.")] = "bf16",
    device: Annotated[
        str | None, typer.Option(help="Torch device (default: cuda when available, else cpu).")
    ] = None,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per KV chunk (block).")] = 64,
    dram_size: Annotated[
        str,
        typer.Option(
            help="Size of the DRAM tier; small by default so that the disk tier serves part of "
            "the reuse (the working set is a few tens of MiB)."
        ),
    ] = "8MiB",
    disk_dir: Annotated[
        Path, typer.Option("--disk-dir", help="Directory of the local-disk tier.")
    ] = Path(".kvtier/run"),
    disk_size: Annotated[str, typer.Option(help="Size of the local-disk tier.")] = "4GiB",
    tier: Annotated[
        list[str] | None,
        typer.Option(
            "--tier",
            help="An extra (e.g. shared) tier after DRAM and disk, by URL (repeatable), "
            "e.g. redis://host:6379/0?size=8GiB.",
        ),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(help="Calibration profile to use when it fits [the `kvtier calibrate` one]."),
    ] = None,
    calibrate: Annotated[
        bool, typer.Option("--calibrate", help="Measure a quick profile now, even if one fits.")
    ] = False,
    admission: Annotated[
        bool,
        typer.Option(
            help="Keep blocks whose expected reuse cannot repay the store off slow tiers."
        ),
    ] = True,
    refine: Annotated[
        bool,
        typer.Option(
            help="Refine the prefill curve with each prefill the kvtier engine measures "
            "(decisions use only what was measured before them)."
        ),
    ] = True,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Prefill in chunk-aligned forwards (both runs): logits with and without kvtier "
            "then agree bit for bit; one forward over the new tokens is the faster default.",
        ),
    ] = False,
    reuse: Annotated[
        bool,
        typer.Option(
            "--reuse", help="Keep and reuse what an earlier run left in the disk tier (else wipe)."
        ),
    ] = False,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the disk tier's blocks in place afterwards.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the workload's texts.")] = _W.seed,
    system_tokens: Annotated[
        int, typer.Option(help="Shared system prompt, tokens.")
    ] = _W.system_tokens,
    chat_sessions: Annotated[int, typer.Option(help="Chat sessions.")] = _W.chat_sessions,
    chat_turns: Annotated[int, typer.Option(help="Turns per chat session.")] = _W.chat_turns,
    turn_tokens: Annotated[
        int, typer.Option(help="Tokens a user (or task) turn adds.")
    ] = _W.turn_tokens,
    docs: Annotated[int, typer.Option(help="Shared RAG documents.")] = _W.docs,
    doc_tokens: Annotated[int, typer.Option(help="Tokens per RAG document.")] = _W.doc_tokens,
    rag_requests: Annotated[int, typer.Option(help="One-shot RAG questions.")] = _W.rag_requests,
    question_tokens: Annotated[
        int, typer.Option(help="Tokens per RAG question.")
    ] = _W.question_tokens,
    agent_sessions: Annotated[int, typer.Option(help="Agentic sessions.")] = _W.agent_sessions,
    agent_steps: Annotated[int, typer.Option(help="Steps per agentic session.")] = _W.agent_steps,
    tool_tokens: Annotated[
        int, typer.Option(help="Tokens of each tool result.")
    ] = _W.tool_result_tokens,
    tool_pause: Annotated[
        float, typer.Option(help="Seconds each tool call pauses.")
    ] = _W.tool_pause_s,
    max_new_tokens: Annotated[
        int, typer.Option(help="Tokens generated per request.")
    ] = _W.max_new_tokens,
    json_out: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", "--out", help="Write PNG plots into this directory."),
    ] = None,
) -> None:
    """Run chat, RAG and agentic sessions through a real model with kvtier and recompute-only."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kvtier.run.job import RunConfig, run_job, total_steps

    spec = WorkloadSpec(
        seed=seed,
        system_tokens=system_tokens,
        chat_sessions=chat_sessions,
        chat_turns=chat_turns,
        turn_tokens=turn_tokens,
        docs=docs,
        doc_tokens=doc_tokens,
        rag_requests=rag_requests,
        question_tokens=question_tokens,
        agent_sessions=agent_sessions,
        agent_steps=agent_steps,
        tool_result_tokens=tool_tokens,
        tool_pause_s=tool_pause,
        max_new_tokens=max_new_tokens,
    )
    config = RunConfig(
        model=model,
        dtype=dtype,
        device=device,
        chunk_tokens=chunk_tokens,
        dram_size=dram_size,
        disk_dir=disk_dir,
        disk_size=disk_size,
        extra_tiers=tuple(tier or ()),
        workload=spec,
        profile_path=profile,
        calibrate=calibrate,
        admission=admission,
        refine=refine,
        exact=exact,
        reuse_disk=reuse,
        keep_disk=keep,
    )
    check_run(config, plot)  # before the model loads
    err = Console(stderr=True)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("kvtier run", total=total_steps(spec))

        def step(label: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, description=label)

        report = run_job(config, progress=step)
    if json_out:
        typer.echo(report.to_json())
    else:
        from kvtier.run.report import render

        out = Console()
        if not out.is_terminal:
            out.width = max(out.width, 160)
        render(report, out)
    if plot is not None:
        from kvtier.run.plot import write_plots

        for path in write_plots(report, plot):
            err.print(f"plot saved to {path}")


def check_run(config: RunConfig, plot: Path | None = None) -> None:
    """Refuse unreadable sizes, an unusable --disk-dir, tier URL or --plot folder of a RunConfig
    (ConfigError/TierPathError) before anything expensive; the checks leave nothing behind."""
    from kvtier.errors import ConfigError
    from kvtier.specs.units import parse_size
    from kvtier.tiers.paths import usable_directory
    from kvtier.tiers.registry import check_tier_url

    for option, size in (("--dram-size", config.dram_size), ("--disk-size", config.disk_size)):
        try:
            parse_size(size)
        except ConfigError as exc:
            raise ConfigError(f"{option}: {exc}") from None
    usable_directory(config.disk_dir, "--disk-dir", keep=False)
    for url, _ in config.tier_urls():
        check_tier_url(url)
    if plot is not None:
        usable_directory(plot, "--plot", keep=False)


def register(cli: typer.Typer) -> None:
    """Add ``kvtier run`` to the main app."""
    cli.command("run")(run_command)
