"""``kvtier plan``: where the memory wall hits, what spills where, and which tier pays back.

Imports only typer/rich and kvtier's specs/cost/plan at module level; matplotlib is loaded
only with ``--plot``. Bad input raises ConfigError/SpecError (one line, exit 2, in cli.main).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli import options as opt
from kvtier.cli.options import DEFAULT_DRAM, DEFAULT_NVME, DEFAULT_NVME_TYPE
from kvtier.errors import ConfigError

_TOKENS = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")


def parse_tokens(text: str, what: str = "--context") -> int:
    """A token count: ``131072``, ``128k`` (×1024) or ``1M`` (×1024²)."""
    match = _TOKENS.match(str(text))
    if not match:
        raise ConfigError(f"{what}: cannot read {text!r}; write a token count like 131072 or 128k")
    scale = {"": 1, "k": 1024, "m": 1024**2}[match.group(2).lower()]
    value = int(match.group(1)) * scale
    if value < 1:
        raise ConfigError(f"{what} must be at least 1 token")
    return value


def plan_command(
    model: opt.ModelPreset = "llama-3.1-8b",
    gpu: opt.GpuPreset = "h100",
    gpus: opt.Gpus = 1,
    context: Annotated[
        str, typer.Option("--context", "-c", help="Tokens per request: 131072, 128k, 1M.")
    ] = "131072",
    concurrency: Annotated[
        str,
        typer.Option(
            "--concurrency",
            "-C",
            help="N, A,B,C, LO:HI (powers of two + overflow points) or LO:HI:STEP.",
        ),
    ] = "1:64",
    reuse: Annotated[
        float, typer.Option("--reuse", help="Fraction of each prompt that is a cached prefix.")
    ] = 0.9,
    output_tokens: Annotated[
        int, typer.Option("--output-tokens", help="Tokens decoded per request.")
    ] = 256,
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Requests/s (default: the GPUs' closed-loop throughput)."),
    ] = None,
    dram: opt.DramSize = DEFAULT_DRAM,
    nvme: opt.NvmeSize = DEFAULT_NVME,
    nvme_type: opt.NvmeType = DEFAULT_NVME_TYPE,
    shared: opt.SharedTier = "none",
    link: opt.LinkPreset = None,
    codec_ratio: opt.CodecRatio = 1.0,
    codec_bandwidth: opt.CodecBandwidth = None,
    kv_dtype: opt.KvDtype = None,
    weight_dtype: opt.WeightDtype = None,
    mfu: opt.Mfu = 0.5,
    mbu: opt.Mbu = 0.8,
    reserve: opt.HbmReserve = "10%",
    lengths: Annotated[
        str | None,
        typer.Option("--lengths", help="Prefix lengths to compare, e.g. 1k,8k,32k."),
    ] = None,
    nvme_writes: Annotated[
        str,
        typer.Option(
            "--nvme-writes", help="spill: sessions living on NVMe write; through: every request."
        ),
    ] = "spill",
    profile: opt.HardwareProfile = None,
    as_json: opt.JsonToStdout = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also write a PNG with three panels.")
    ] = None,
) -> None:
    """Where KV overflows HBM as concurrency rises, what spills to each tier, and its cost."""
    options = dict(locals())
    from kvtier.cli.hardware import read_hardware, spill_tiers
    from kvtier.cli.values import byte_size, config_from
    from kvtier.plan import PlanRequest, parse_concurrency, parse_reserve, plan
    from kvtier.tiers.paths import writable_file

    if plot is not None:
        writable_file(plot, "--plot")
    hardware = read_hardware(profile, model, kv_dtype, weight_dtype, gpu, link)
    if nvme_writes not in ("spill", "through"):
        raise ConfigError(f"--nvme-writes is spill or through, not {nvme_writes!r}")
    if codec_ratio <= 0:
        raise ConfigError(f"--codec-ratio must be positive, got {codec_ratio}")
    decode_bw = byte_size(codec_bandwidth, "--codec-bandwidth") if codec_bandwidth else None
    if decode_bw is not None and decode_bw <= 0:
        raise ConfigError("--codec-bandwidth must be positive")
    tiers = spill_tiers(hardware, dram, nvme, nvme_type, shared, codec_ratio, decode_bw)

    values, is_range = parse_concurrency(concurrency)
    fraction, reserve_bytes = parse_reserve(reserve)
    prefix_lengths = (
        tuple(sorted({parse_tokens(x, "--lengths") for x in lengths.split(",")})) if lengths else ()
    )
    req = config_from(
        PlanRequest,
        options,
        model=hardware.model,
        gpu=hardware.gpu,
        link=hardware.link,
        context=parse_tokens(context),
        concurrency=values,
        add_breakpoints=is_range,
        prefix_reuse=reuse,
        tiers=tuple(tiers),
        request_rate=rate,
        reserve_fraction=fraction,
        reserve_bytes=reserve_bytes,
        prefix_lengths=prefix_lengths,
    )
    result = plan(req)

    if plot is not None:
        from kvtier.plan.plot import write_plot

        write_plot(result, req, plot)
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    from kvtier.plan.report import render

    render(result, console)
    if plot is not None:
        console.print(f"plot written to {plot}")


def register(cli: typer.Typer) -> None:
    """Add ``kvtier plan`` to the CLI."""
    cli.command("plan")(plan_command)
