"""``kvtier bench serve``: vLLM alone vs kvtier vs vLLM's ExampleConnector, measured by vLLM's own
benchmark client.

Found and registered by :func:`kvtier.cli.bench_cmd.make_bench_app` (``register_bench``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvtier.cli.options import JsonOnStdout
from kvtier.cli.values import int_list, name_list

#: The quick run (the defaults) and the issue's full-size target run (``--target``).
QUICK = {
    "concurrency": "1,4",
    "prefix_len": 2048,
    "suffix_len": 64,
    "num_prefixes": 4,
    "num_prompts": 16,
    "output_len": 4,
    "random_input_len": 512,
    "random_output_len": 16,
    "random_prompts": 8,
    "random_concurrency": 4,
    "repeat": 1,
    "preload_check": False,
}
TARGET = {
    **QUICK,
    "concurrency": "1,4,8",
    "prefix_len": 4096,
    "suffix_len": 128,
    "num_prefixes": 12,
    "num_prompts": 48,
    "random_input_len": 1024,
    "random_prompts": 16,
    "repeat": 3,
    "preload_check": True,
}
#: Help of the options the presets set, ``{}`` standing for the quick run's value.
PRESET_HELP = {
    "concurrency": "Client concurrencies, comma-separated [{}].",
    "prefix_len": "Tokens per shared prefix [{}].",
    "suffix_len": "Tokens after the prefix in each prompt [{}].",
    "num_prefixes": "Distinct prefixes (or sessions) [{}].",
    "num_prompts": "Reuse prompts per run (prefix_repetition prompts, or turns of all "
    "sessions) [{}].",
    "output_len": "Tokens generated per prompt [{}].",
    "random_input_len": "Tokens per random prompt [{}].",
    "random_output_len": "Tokens generated per random prompt [{}].",
    "random_prompts": "Random prompts per round [{}].",
    "random_concurrency": "Client concurrency of the random rounds [{}].",
    "repeat": "Random rounds per system [{}]; ≥ 3 keeps vLLM and kvtier up and alternates.",
}


_REUSE_ROUNDS = (
    "Reuse runs per system and concurrency: each round starts every system afresh, the order "
    "turned by one a round; figures are medians over rounds."
)
_INTERLEAVE = (
    "With --reuse-rounds: keep every server up and alternate the runs (each concurrency round "
    "after round, every system in turn, fresh requests a round); ratios to vLLM alone per round."
)


def _preset(name: str) -> Any:
    """Option ``name`` of the presets: None unless given, which leaves it to the preset."""
    return typer.Option(help=PRESET_HELP[name].format(QUICK[name]))


def serve(
    systems: Annotated[
        str,
        typer.Option(
            help="Systems, comma-separated: vllm, ceiling (also called oracle: vLLM with a "
            "pool that holds everything the run creates), kvtier, kvtier-layerwise and "
            "kvtier-whole (loads and saves layer by layer beside the forward, or whole), "
            "kvtier-disk, example."
        ),
    ] = "vllm,kvtier,kvtier-disk,example",
    tensor_parallel: Annotated[
        int,
        typer.Option(help="Tensor-parallel ranks of every system's engine (one thread each)."),
    ] = 1,
    target: Annotated[
        bool,
        typer.Option(
            "--target",
            help="The issue's full-size run (4096-token prefixes, 12 × 4 prompts, concurrency "
            "1,4,8, random 3 rounds); options given explicitly still win. Long on a CPU.",
        ),
    ] = False,
    concurrency: Annotated[str | None, _preset("concurrency")] = None,
    prefix_len: Annotated[int | None, _preset("prefix_len")] = None,
    suffix_len: Annotated[int | None, _preset("suffix_len")] = None,
    num_prefixes: Annotated[int | None, _preset("num_prefixes")] = None,
    num_prompts: Annotated[int | None, _preset("num_prompts")] = None,
    output_len: Annotated[int | None, _preset("output_len")] = None,
    sessions: Annotated[
        bool,
        typer.Option(
            "--sessions",
            help="Reuse runs send multi-turn chats instead of prefix_repetition: --num-prefixes "
            "sessions taking turns, each turn the previous prompt + an answer + a new "
            "--suffix-len message (vLLM's custom dataset).",
        ),
    ] = False,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Reuse runs replay a slice of this Mooncake-format trace (e.g. "
            "../shared/traces/mooncake_synthetic_trace.jsonl) through vLLM's timed_trace "
            "dataset, each request at its time, instead of prefix_repetition.",
            show_default=False,
        ),
    ] = None,
    trace_requests: Annotated[int, typer.Option(help="Requests of the trace's slice.")] = 32,
    trace_start: Annotated[int, typer.Option(help="The slice's first line of the trace.")] = 0,
    trace_block_tokens: Annotated[
        int, typer.Option(help="Tokens each of the trace's 512-token hash blocks becomes.")
    ] = 64,
    trace_time_scale: Annotated[
        float, typer.Option(help="Multiplies the trace's times (2: half the arrival rate).")
    ] = 1.0,
    reuse_rounds: Annotated[int, typer.Option(help=_REUSE_ROUNDS)] = 1,
    interleave: Annotated[bool, typer.Option(help=_INTERLEAVE)] = False,
    random: Annotated[
        bool, typer.Option(help="Run the no-reuse (random dataset) throughput check.")
    ] = True,
    preload_check: Annotated[
        bool | None,
        typer.Option(
            "--preload-check/--no-preload-check",
            help="Run the preloading check (a queued workload from disk, preloading on and "
            "off) (default: off; on with --target).",
        ),
    ] = None,
    random_input_len: Annotated[int | None, _preset("random_input_len")] = None,
    random_output_len: Annotated[int | None, _preset("random_output_len")] = None,
    random_prompts: Annotated[int | None, _preset("random_prompts")] = None,
    random_concurrency: Annotated[int | None, _preset("random_concurrency")] = None,
    repeat: Annotated[int | None, _preset("repeat")] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            help="vLLM's --max-num-batched-tokens, every system (default: vLLM's); vLLM's "
            "ExampleConnector needs a whole prompt in one step.",
            show_default=False,
        ),
    ] = None,
    pool_blocks: Annotated[
        int | None,
        typer.Option(
            help="vLLM's KV pool in 128-token blocks, every system (default: half the "
            "prefixes' blocks).",
            show_default=False,
        ),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(help="Engines' max model length (default: the longest request, rounded up)."),
    ] = None,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per kvtier chunk.")] = 256,
    dram_size: Annotated[
        str | None,
        typer.Option(help="kvtier's host-memory tier (default: one concurrency's KV × 1.25)."),
    ] = None,
    disk_size: Annotated[
        str | None, typer.Option(help="kvtier's disk tier (default: twice what the run stores).")
    ] = None,
    directory: Annotated[
        Path,
        typer.Option("--dir", help="Run folder: logs, client results, disk tiers."),
    ] = Path(".kvtier/bench-serve"),
    seed: Annotated[int, typer.Option(help="Seed of the client's datasets and the engines.")] = 0,
    quiet_load: Annotated[
        float | None,
        typer.Option(
            help="Before each client run wait (≤ 5 min) until the 1-minute load average is at "
            "most this: a shared CPU's other work then spares the runs.",
            show_default=False,
        ),
    ] = None,
    keep: Annotated[bool, typer.Option(help="Leave the tiers' data in place.")] = False,
    json_out: JsonOnStdout = False,
    plot: Annotated[
        Path | None, typer.Option(help="Save a PNG here (a folder gets bench-serve.png).")
    ] = None,
    strict: Annotated[bool, typer.Option(help="Exit 1 when any threshold is missed.")] = False,
) -> None:
    """Each system on its own vLLM server (same KV pool), measured by vLLM's `bench serve`."""
    options = dict(locals())
    from datetime import UTC, datetime

    from rich.console import Console

    from kvtier.bench.serve import ServeBench
    from kvtier.bench.serve_config import (
        SYSTEM_ALIASES,
        PrefixWorkload,
        PreloadWorkload,
        RandomWorkload,
        ServeBenchConfig,
    )
    from kvtier.bench.serve_report import serve_json, serve_plot, serve_table
    from kvtier.bench.serve_trace import TRACE_MODEL_LEN, TraceSlice
    from kvtier.cli.bench_cmd import given_command
    from kvtier.cli.console import print_report, step_progress
    from kvtier.engines.vllm.compat import require_modules
    from kvtier.specs import parse_size
    from kvtier.tiers.paths import usable_directory, writable_file

    preset = TARGET if target else QUICK
    v = {k: preset[k] if options[k] is None else options[k] for k in QUICK}
    sliced = None
    if trace is not None:
        sliced = TraceSlice.read(
            trace,
            requests=trace_requests,
            start=trace_start,
            block_tokens=trace_block_tokens,
            time_scale=trace_time_scale,
            max_input=(max_model_len or TRACE_MODEL_LEN) - 512,
        )
    levels = str(v["concurrency"])
    config = ServeBenchConfig(
        systems=tuple(SYSTEM_ALIASES.get(s, s) for s in name_list(systems)),
        tensor_parallel=tensor_parallel,
        concurrency=int_list(
            levels,
            f"--concurrency: cannot read {levels!r}; write e.g. 1,4,8",
            "--concurrency needs at least one value",
        ),
        prefix=PrefixWorkload(
            v["prefix_len"],
            v["suffix_len"],
            v["num_prefixes"],
            v["num_prompts"],
            v["output_len"],
            sessions,
            sliced,
        ),
        random=RandomWorkload(
            v["random_input_len"],
            v["random_output_len"],
            v["random_prompts"],
            v["random_concurrency"],
            v["repeat"],
        )
        if random
        else None,
        preload=PreloadWorkload(
            v["prefix_len"] + v["suffix_len"], chunk_tokens=chunk_tokens, seed=seed
        )
        if v["preload_check"]
        else None,
        interleave=interleave,
        pool_blocks=pool_blocks,
        max_model_len=max_model_len,
        max_batched_tokens=max_num_batched_tokens,
        chunk_tokens=chunk_tokens,
        dram_size=parse_size(dram_size) if dram_size else None,
        disk_size=parse_size(disk_size) if disk_size else None,
        work_dir=directory,
        seed=seed,
        keep=keep,
        quiet_load=quiet_load,
        reuse_rounds=reuse_rounds,
    )
    usable_directory(directory, "--dir", keep=False)  # before any server starts
    if plot is not None and plot.suffix.lower() == ".png":
        writable_file(plot, "--plot")
    elif plot is not None:
        usable_directory(plot, "--plot", keep=False)
    require_modules("kvtier bench serve", ("vllm",))
    if config.prefix.sessions:  # the prompts' tokenizer; pandas reads them in vLLM's client
        require_modules("kvtier bench serve --sessions", ("transformers", "pandas"))
    err = Console(stderr=True)
    with step_progress(err) as progress:
        bench = ServeBench(config)
        task = progress.add_task("bench serve", total=bench.steps())
        labels: list[str] = []

        def step(label: str) -> None:
            if labels:
                progress.update(task, advance=1)
            labels.append(label)
            progress.update(task, description=label)

        bench.on_step = step
        report = _run_stopping_on_sigterm(bench)
    stamp = {
        "date": datetime.now(UTC).date().isoformat(),
        "command": given_command("serve"),
    }
    print_report(
        json_out,
        lambda: serve_json(report, stamp=stamp),
        lambda out: out.print(serve_table(report)),
        180,
    )
    if plot is not None:
        saved = serve_plot(report, plot)
        err.print(f"plot saved to {saved}")
    err.print(f"logs and client results: {bench.run_dir}")
    if strict and any(t.passed is False for t in report.targets()):
        raise typer.Exit(1)


def _run_stopping_on_sigterm(bench):
    """``bench.run()``, with SIGTERM raised as SystemExit so its servers are stopped."""
    import signal
    import sys

    def stop(signum, frame):
        sys.exit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return bench.run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def register_bench(bench: typer.Typer) -> None:
    """Add ``serve`` to the ``kvtier bench`` sub-app."""
    bench.command("serve")(serve)
