"""``kvtier run``: the main job — a realistic workload through a real model, with and without
kvtier.

``--engine vllm`` (the default) drives the embedded model through vLLM's OpenAI server, alone and
with kvtier's KV connector (:mod:`kvtier.job.vllm_job`); ``--engine hf`` runs the transformers
job, kvtier vs recompute-only (:mod:`kvtier.job.hf_job`). torch, transformers and vLLM are imported
inside the command, so other commands stay fast.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvtier.cli.options import (
    CalibrationFile,
    EmbeddedModel,
    ExactPrefill,
    JsonOnStdout,
    Recalibrate,
    TorchDevice,
)
from kvtier.cli.values import config_from
from kvtier.workloads.sessions import WorkloadSpec

if TYPE_CHECKING:
    from kvtier.job.hf_job import RunConfig
    from kvtier.job.vllm_job import VllmRunConfig

_W = WorkloadSpec()


class Engine(StrEnum):
    """The engines ``kvtier run`` drives."""

    vllm = "vllm"
    hf = "hf"


#: Options that only one engine's job reads (given with the other engine: a one-line error).
HF_ONLY = (
    "model", "device", "tier", "profile", "calibrate", "admission", "refine", "exact",
    "reuse", "system_tokens", "chat_sessions", "chat_turns", "turn_tokens", "docs",
    "doc_tokens", "rag_requests", "question_tokens", "agent_sessions", "agent_steps",
    "tool_tokens", "tool_pause",
)  # fmt: skip
VLLM_ONLY = (
    "pool_blocks", "concurrency", "budget", "scale", "kvtier", "shm_dir", "workload", "disk_codec",
    "max_model_len",
)  # fmt: skip
#: Defaults that differ by engine (None or empty on the command line: the engine's own).
HF_DEFAULTS = {
    "dtype": "bf16",
    "chunk_tokens": 64,
    "dram_size": "8MiB",
    "disk_size": "4GiB",
    "max_new_tokens": 6,
}


def run_command(
    ctx: typer.Context,
    engine: Annotated[
        Engine,
        typer.Option(
            help="vllm: vLLM alone vs vLLM + kvtier's connector on a long-context workload; "
            "hf: the transformers job, kvtier vs recompute-only."
        ),
    ] = Engine.vllm,
    model: EmbeddedModel = "embedded",
    dtype: Annotated[
        str | None,
        typer.Option(
            help="Model (and KV) dtype: bf16, fp16 or fp32 (vllm also auto: bf16 where the CPU "
            "computes it natively, else fp32; a --disk-codec keeps bf16. vllm: auto, hf: bf16)."
        ),
    ] = None,
    device: TorchDevice = None,
    chunk_tokens: Annotated[
        int | None, typer.Option(help="Tokens per KV chunk (block) (vllm: 256, hf: 64).")
    ] = None,
    dram_size: Annotated[
        str | None,
        typer.Option(
            help="Size of the DRAM tier; smaller than the working set so that the disk tier "
            "serves part of the reuse (vllm: 60% of the workload's KV, hf: 8MiB)."
        ),
    ] = None,
    disk_dir: Annotated[
        Path,
        typer.Option(
            "--disk-dir", help="Directory of the local-disk tier (vllm: and of the run's logs)."
        ),
    ] = Path(".kvtier/run"),
    disk_size: Annotated[
        str | None,
        typer.Option(help="Size of the local-disk tier (vllm: twice the workload's KV, hf: 4GiB)."),
    ] = None,
    pool_blocks: Annotated[
        int, typer.Option(help="vllm: the engine's KV pool in 128-token blocks (both phases).")
    ] = 72,
    max_model_len: Annotated[
        int,
        typer.Option(
            help="vllm: the engine's max model length in tokens (a smaller one lets a smaller "
            "--pool-blocks start; at least 2056, the warm-up's 2k prompt, and the longest "
            "request; the warm-up's 4k prompt is left out below 4104)."
        ),
    ] = 8192,
    concurrency: Annotated[
        int, typer.Option(help="vllm: requests in flight at once, at most.")
    ] = 4,
    budget: Annotated[
        float,
        typer.Option(
            help="vllm: seconds the whole run aims at; the workload shrinks to fit the "
            "prefill speed measured at the start (never below 2k-token prompts)."
        ),
    ] = 300.0,
    scale: Annotated[
        float | None,
        typer.Option(
            help="vllm: run the workload at this scale (0: smallest, 1: full) instead of "
            "fitting it to --budget."
        ),
    ] = None,
    kvtier: Annotated[
        bool | None,
        typer.Option(
            "--kvtier/--no-kvtier",
            help="vllm: run the vLLM + kvtier phase (default: when the connector is installed).",
        ),
    ] = None,
    shm_dir: Annotated[
        Path, typer.Option(help="vllm: where kvtier's host-memory tier lives (a tmpfs).")
    ] = Path("/dev/shm"),
    disk_codec: Annotated[
        str,
        typer.Option(
            help="vllm: the disk tier's codec= (raw, kv), or both: the kvtier phase twice, "
            "raw then kv, the tiers below the working set (DRAM a quarter, disk half of it, "
            "unless sized), for the tokens and hits the codec buys."
        ),
    ] = "raw",
    workload: Annotated[
        Path | None,
        typer.Option(
            help="vllm: a JSON or TOML file of workload fields (chat_sessions, doc_tokens, …; "
            "see kvtier.workloads.longctx.LongContextSpec) instead of the default workload."
        ),
    ] = None,
    tier: Annotated[
        list[str] | None,
        typer.Option(
            "--tier",
            help="An extra (e.g. shared) tier after DRAM and disk, by URL (repeatable), "
            "e.g. redis://host:6379/0?ttl=3600.",
        ),
    ] = None,
    profile: CalibrationFile = None,
    calibrate: Recalibrate = False,
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
    exact: ExactPrefill = False,
    reuse: Annotated[
        bool,
        typer.Option(
            "--reuse", help="Keep and reuse what an earlier run left in the disk tier (else wipe)."
        ),
    ] = False,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="Leave the disk tier's blocks (vllm: the run's folder and the /dev/shm tier) "
            "in place afterwards.",
        ),
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
        int | None, typer.Option(help="Tokens generated per request (vllm: 16, hf: 6).")
    ] = None,
    json_out: JsonOnStdout = False,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", "--out", help="Write PNG plots into this directory."),
    ] = None,
) -> None:
    """Run chats, RAG, agentic sessions (vllm: and code bursts) through a real model, with kvtier
    and without."""
    options = dict(locals())
    from kvtier.errors import ConfigError

    engine_name = Engine(engine).value
    given = {name for name in (*HF_ONLY, *VLLM_ONLY) if _given(ctx, name)}
    other = sorted(given & set(VLLM_ONLY if engine_name == "hf" else HF_ONLY))
    if other:
        names = ", ".join("--" + n.replace("_", "-") for n in other)
        raise ConfigError(f"{names}: not an option of --engine {engine_name}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if engine_name == "vllm":
        vllm_values = {"seed_given": _given(ctx, "seed"), "dtype": dtype or "auto"}
        config = VllmArgs(**(options | vllm_values)).config()
        check_vllm_run(config, plot)  # before the server starts
        _run_vllm(config, json_out, plot)
        return
    from kvtier.job.hf_job import RunConfig, run_job, total_steps

    hf = options | {k: d for k, d in HF_DEFAULTS.items() if options[k] in (None, "")}
    spec = config_from(WorkloadSpec, hf, tool_result_tokens=tool_tokens, tool_pause_s=tool_pause)
    config = config_from(
        RunConfig,
        hf,
        extra_tiers=tuple(tier or ()),
        workload=spec,
        profile_path=profile,
        reuse_disk=reuse,
        keep_disk=keep,
    )
    check_run(config, plot)  # before the model loads
    from kvtier.job.hf_plot import write_plots
    from kvtier.job.hf_report import render

    report = _with_progress(lambda step: run_job(config, progress=step), total_steps(spec))
    _emit(report, json_out, render, write_plots, plot)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given (on the command line or in the environment)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


class VllmArgs:
    """The vLLM job's command-line values, turned into a :class:`VllmRunConfig`."""

    def __init__(self, **values):
        self.values = values

    def config(self) -> VllmRunConfig:
        """The run's config (ConfigError for unreadable sizes or impossible numbers)."""
        from dataclasses import replace

        from kvtier.errors import ConfigError
        from kvtier.job.vllm_job import VllmRunConfig, warmup_lengths_for
        from kvtier.specs.units import parse_size
        from kvtier.workloads.longctx import LongContextSpec, scaled

        v = self.values
        sizes = {}
        for option, key in (("--dram-size", "dram_size"), ("--disk-size", "disk_size")):
            if v[key] is None:
                sizes[key] = None
                continue
            try:
                sizes[key] = int(parse_size(v[key]))
            except ConfigError as exc:
                raise ConfigError(f"{option}: {exc}") from None
        spec = LongContextSpec(seed=v["seed"])
        if v["workload"] is not None:
            spec = LongContextSpec.from_file(v["workload"])
            if v.get("seed_given"):
                spec = replace(spec, seed=v["seed"])
        if v["max_new_tokens"] is not None:
            if v["max_new_tokens"] < 1:
                raise ConfigError("--max-new-tokens must be at least 1")
            spec = replace(spec, output_tokens=v["max_new_tokens"])
        if v["scale"] is not None:
            if not 0 <= v["scale"] <= 1:
                raise ConfigError(f"--scale must be within [0, 1], got {v['scale']}")
            spec = scaled(spec, v["scale"])
        return VllmRunConfig(
            workload=spec,
            pool_blocks=v["pool_blocks"],
            max_model_len=v["max_model_len"],
            warmup_lengths=warmup_lengths_for(v["max_model_len"]),
            concurrency=v["concurrency"],
            budget_s=v["budget"],
            fit_budget=v["scale"] is None,
            chunk_tokens=256 if v["chunk_tokens"] is None else v["chunk_tokens"],
            dram_size=sizes["dram_size"],
            disk_size=sizes["disk_size"],
            work_dir=v["disk_dir"],
            shm_dir=v["shm_dir"],
            kvtier=v["kvtier"],
            keep=v["keep"],
            disk_codec=v["disk_codec"],
            dtype=v["dtype"],
        )


def check_vllm_run(config: VllmRunConfig, plot: Path | None = None) -> None:
    """Refuse a vLLM job that cannot run (vLLM or httpx missing, unusable folders) before any
    server starts; the checks leave nothing behind."""
    from kvtier.engines.vllm.compat import require_modules
    from kvtier.tiers.paths import usable_directory

    require_modules("kvtier run --engine vllm", ("vllm", "httpx"))
    usable_directory(config.work_dir, "--disk-dir", keep=False)
    if config.kvtier is not False:
        usable_directory(config.shm_dir, "--shm-dir", keep=False)
    if plot is not None:
        usable_directory(plot, "--plot", keep=False)


def _with_progress(job, total: int | None):
    """Run ``job(step)`` under a progress bar on stderr that ``step(label, done, total)``
    moves; its result."""
    from rich.console import Console

    from kvtier.cli.console import step_progress

    with step_progress(Console(stderr=True)) as progress:
        task = progress.add_task("kvtier run", total=total)

        def step(label: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, description=label)

        return job(step)


def _emit(report, json_out: bool, render, write_plots, plot: Path | None) -> None:
    """Print a run's report (JSON on stdout, or ``render``'s tables) and save its plots."""
    from rich.console import Console

    from kvtier.cli.console import table_console

    if json_out:
        typer.echo(report.to_json())
    else:
        render(report, table_console())
    if plot is not None:
        err = Console(stderr=True)
        for path in write_plots(report, plot):
            err.print(f"plot saved to {path}")


def _run_vllm(config: VllmRunConfig, json_out: bool, plot: Path | None) -> None:
    from kvtier.job.vllm_job import run_vllm_job
    from kvtier.job.vllm_plot import write_plots
    from kvtier.job.vllm_report import render

    report = _with_progress(lambda step: run_vllm_job(config, progress=step), None)
    _emit(report, json_out, render, write_plots, plot)
    if report.failed:
        for failure in report.failed:
            typer.secho(f"error: {failure}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1)


def check_run(config: RunConfig, plot: Path | None = None) -> None:
    """Refuse unreadable sizes, an unusable --disk-dir, tier URL or --plot folder of a RunConfig
    (ConfigError/TierPathError) before anything expensive; the checks leave nothing behind."""
    from kvtier.engines.embedded import check_dtype
    from kvtier.errors import ConfigError
    from kvtier.specs.units import parse_size
    from kvtier.tiers.paths import usable_directory
    from kvtier.tiers.registry import check_tier_url

    try:
        check_dtype(config.dtype)
    except ConfigError as exc:
        raise ConfigError(f"--dtype: {exc}") from None
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
