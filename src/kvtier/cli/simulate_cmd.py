"""``kvtier simulate``: replay a trace (or a generated workload) through simulated replicas.

Takes ``kvtier plan``'s model and hardware flags with its defaults (DRAM + NVMe tiers), or,
with ``--calibration REPORT``, the engine, tiers and step times a ``kvtier run --engine vllm``
report measured on this machine. Bad input (a missing trace, a malformed line, an unknown
preset, an unwritable output) is refused before anything runs.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from kvtier.cli import options as opt
from kvtier.cli.console import print_report
from kvtier.cli.options import DEFAULT_DRAM, DEFAULT_NVME, DEFAULT_NVME_TYPE
from kvtier.cli.values import config_from
from kvtier.errors import ConfigError


def simulate_command(
    model: opt.ModelPreset = "llama-3.1-8b",
    gpu: opt.GpuPreset = "h100",
    gpus: opt.Gpus = 1,
    replicas: Annotated[int, typer.Option(help="Serving replicas (share the shared tier).")] = 1,
    dram: opt.DramSize = DEFAULT_DRAM,
    nvme: opt.NvmeSize = DEFAULT_NVME,
    nvme_type: opt.NvmeType = DEFAULT_NVME_TYPE,
    shared: opt.SharedTier = "none",
    link: opt.LinkPreset = None,
    network: Annotated[
        str, typer.Option(help="Network bandwidth the replicas share to the shared tier.")
    ] = "12.5GB",
    codec_ratio: opt.CodecRatio = 1.0,
    codec_bandwidth: opt.CodecBandwidth = None,
    kv_dtype: opt.KvDtype = None,
    weight_dtype: opt.WeightDtype = None,
    mfu: opt.Mfu = 0.5,
    mbu: opt.Mbu = 0.8,
    reserve: opt.HbmReserve = "10%",
    profile: opt.HardwareProfile = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="A `kvtier run --engine vllm --json` report of another run, or a `kvtier "
            "calibrate` profile: the engine, tiers and step times measured on this machine "
            "replace the model and hardware flags."
        ),
    ] = None,
    concurrency_calibration: Annotated[
        Path | None,
        typer.Option(
            help="With --calibration: another run's report at a concurrency above one, whose "
            "replay fits how much each request in flight slows the engine's steps (a host "
            "whose cores the engine shares with its API server and clients)."
        ),
    ] = None,
    refine: Annotated[
        bool | None,
        typer.Option(
            "--refine/--no-refine",
            help="With a run report: fit the step times by replaying that run (default: when "
            "too few of its requests ran alone to fit them from).",
        ),
    ] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Trace file to replay (default: a generated workload).")
    ] = None,
    trace_format: Annotated[
        str, typer.Option(help="mooncake, bailian or kvtier-run.")
    ] = "mooncake",
    trace_block_tokens: Annotated[
        int | None, typer.Option(help="Tokens per trace block (format's default).")
    ] = None,
    time_unit: Annotated[
        float | None, typer.Option(help="Seconds per trace time unit (format's default).")
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option(help="Skip (and count) malformed trace lines instead of failing.")
    ] = False,
    phase: Annotated[
        str | None, typer.Option(help="kvtier-run traces: which phase (vllm, vllm+kvtier).")
    ] = None,
    workload: Annotated[
        str,
        typer.Option(
            help="Generated workload without --trace: mix (chats, RAG, agents, code at fleet "
            "scale), unique (one-shot prompts) or longctx (kvtier run's own workload)."
        ),
    ] = "mix",
    workload_file: Annotated[
        Path | None,
        typer.Option(help="longctx: a JSON/TOML file of its fields, as `kvtier run --workload`."),
    ] = None,
    sessions: Annotated[int, typer.Option(help="Generated: sessions (mix) or requests.")] = 500,
    rate: Annotated[float, typer.Option(help="Generated: sessions (requests) per second.")] = 2.0,
    seed: Annotated[int, typer.Option(help="Seed of the generated workload.")] = 0,
    block_tokens: Annotated[
        int | None,
        typer.Option(help="Engine block tokens (default: the trace's block, or 16 / 128)."),
    ] = None,
    chunk_tokens: Annotated[
        int | None, typer.Option(help="kvtier chunk tokens (default: 256, or the block).")
    ] = None,
    max_batched_tokens: Annotated[
        int | None, typer.Option(help="Token budget per engine step.")
    ] = None,
    max_seqs: Annotated[int, typer.Option(help="Running requests per replica at most.")] = 256,
    pool_blocks: Annotated[
        int,
        typer.Option(help="With a `kvtier calibrate` profile: the engine's pool in blocks."),
    ] = 72,
    concurrency: Annotated[
        int | None, typer.Option(help="Client requests in flight at most (default: open loop).")
    ] = None,
    routing: Annotated[
        str,
        typer.Option(
            help="Which replica a request goes to: session, least-loaded, round-robin, prefix "
            "(the longest prefix in an engine's own cache) or tier (the least time to get its "
            "KV there: engine, kvtier's tiers, shared tier, recompute, plus the queue)."
        ),
    ] = "session",
    kvtier: Annotated[
        bool, typer.Option("--kvtier/--no-kvtier", help="kvtier's tiers below the engine.")
    ] = True,
    preemption: Annotated[
        str,
        typer.Option(
            help="recompute (vLLM's), offload (reload from kvtier's tiers), or auto: offload "
            "with kvtier, recompute without."
        ),
    ] = "auto",
    preload: Annotated[bool, typer.Option(help="Preload queued requests' KV.")] = True,
    decide: Annotated[
        bool, typer.Option(help="Load-or-recompute cut (else load every hit).")
    ] = True,
    eviction: Annotated[str, typer.Option(help="Tier eviction: lru, arc, cost.")] = "lru",
    slo_ttft: Annotated[float, typer.Option(help="Goodput SLO: TTFT seconds.")] = 2.0,
    slo_tpot: Annotated[float, typer.Option(help="Goodput SLO: seconds per output token.")] = 0.1,
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=V1,V2,…: concurrency, rate, dram, nvme, link (bandwidth), context "
            "(prompt scale), preemption, eviction, replicas, routing — the memory-wall table "
            "and plot. Twice: every combination, the second's values drawn as series (e.g. "
            "--sweep replicas=4,16,64 --sweep routing=session,prefix,tier)."
        ),
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(
            help="With a kvtier-run trace: replay each of its phases and set the simulated "
            "TTFT, end to end and preemptions beside the measured ones."
        ),
    ] = False,
    as_json: opt.JsonToStdout = False,
    records: Annotated[
        bool, typer.Option(help="With --json: include every request's record.")
    ] = False,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Write the per-request records as CSV.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write PNG plots into this directory.")
    ] = None,
) -> None:
    """Simulate serving replicas with kvtier's tiers: TTFT, GPU time waiting for KV, links."""
    from kvtier.cli import simulate_setup as setup

    args = dict(locals())
    for target in (csv_out,):
        if target is not None:
            from kvtier.tiers.paths import writable_file

            writable_file(target, "--csv")
    if plot is not None:
        from kvtier.tiers.paths import usable_directory

        usable_directory(plot, "--plot", keep=True)
    specs = setup.parse_sweeps(sweep) if sweep else ()
    sim_args = config_from(setup.SimArgs, args)
    if compare:
        if specs:
            raise ConfigError("--compare and --sweep do not go together")
        found = setup.compare_with_run(sim_args)
        from kvtier.sim.report import render_compare

        print_report(as_json, lambda: json.dumps(found, indent=2), partial(render_compare, found))
        return
    built = setup.build(sim_args)
    if not specs:
        result = _run(built, as_json)
        _report_one(built, result, as_json, records, csv_out, plot)
        return
    points = len(setup.sweep_points(specs))
    rows = setup.run_sweep(built, specs, progress=_progress(as_json, points))
    _report_sweep(built, specs, rows, as_json, plot)


def _progress(quiet: bool, total: int):
    if quiet:
        return None
    from rich.console import Console

    from kvtier.cli.console import step_progress

    progress = step_progress(Console(stderr=True))
    task: dict[str, Any] = {}

    def tick(label: str, done: int, n: int) -> None:
        if not task:
            progress.start()
            task["id"] = progress.add_task(label, total=n)
        progress.update(task["id"], completed=done, total=n, description=label)
        if done >= n:
            progress.stop()

    return tick


def _run(built, quiet: bool):
    from kvtier.sim.simulator import simulate

    tick = _progress(quiet, len(built.requests))

    def progress(done: int, total: int) -> None:
        if tick is not None:
            tick("simulating", done, total)

    return simulate(built.config, built.requests, progress)


def _report_one(built, result, as_json: bool, records: bool, csv_out, plot) -> None:
    result.config = built.describe()
    if csv_out is not None:
        csv_out.write_text(result.records_csv())
    if plot is not None:
        from kvtier.sim.plot import write_run_plot

        write_run_plot(result, plot / "simulate.png")
    from kvtier.sim.report import render

    print_report(
        as_json,
        lambda: json.dumps(result.to_dict(records=records), indent=2),
        partial(render, result),
    )


def _report_sweep(built, specs, rows, as_json: bool, plot) -> None:
    name = specs[0].name
    series = specs[1].name if len(specs) > 1 else None
    if plot is not None:
        from kvtier.sim.plot import write_series_plot, write_sweep_plot

        if series is None:
            write_sweep_plot(name, rows, plot / f"sweep-{name}.png")
        else:
            write_series_plot(name, series, rows, plot / f"sweep-{name}-{series}.png")
    from kvtier.sim.report import render_sweep

    def as_json_text() -> str:
        out: dict[str, Any] = {"config": built.describe(), "sweep": name}
        if series is not None:
            out["series"] = series
        out["rows"] = rows
        return json.dumps(out, indent=2)

    print_report(as_json, as_json_text, partial(render_sweep, name, rows, series=series))


def register(cli: typer.Typer) -> None:
    """Add ``kvtier simulate`` to the CLI."""
    cli.command("simulate")(simulate_command)


__all__ = ["register", "simulate_command"]
