"""``kvtier calibrate``: measure prefill, tier loads and copies on this machine; save a profile.

The profile (JSON) feeds the cost model: ``CalibrationProfile.load(path).cost_model()``.
torch/transformers are imported inside the command, so other commands stay fast.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli.options import ChunkTokens, EmbeddedModel, MeasuredTiers, ModelDtype, TorchDevice
from kvtier.cli.values import config_from, int_list

DEFAULT_DIR = Path(".kvtier") / "calibrate"
#: Break-even and prediction lengths shown in the summary.
SHOW_TOKENS = (256, 1024, 4096)


def default_tier_urls(directory: Path, chunk_bytes: int, chunks: int) -> list[str]:
    """A memory tier and a disk tier in ``directory``, each with room for the test chunks."""
    size = max(64 << 20, 2 * chunks * (chunk_bytes + 8192))
    return [
        f"memory://?size={size}",
        f"slab://{directory.resolve()}?size={size}&name=disk",
    ]


def calibrate_command(
    model: EmbeddedModel = "embedded",
    dtype: ModelDtype = "bf16",
    device: TorchDevice = None,
    tier: MeasuredTiers = None,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help=f"Directory of the default disk tier [{DEFAULT_DIR}]."),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Longest prefill measured.")] = 1024,
    budget: Annotated[
        float, typer.Option(help="Seconds the prefill/decode measurements may take, about.")
    ] = 40.0,
    repeats: Annotated[int, typer.Option(help="Repeats per point (the fastest counts).")] = 2,
    chunk_tokens: ChunkTokens = 256,
    load_chunks: Annotated[
        str, typer.Option(help="Chunk counts loaded per tier, comma-separated.")
    ] = "1,2,4,8,16",
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Profile path [$KVTIER_CACHE_DIR or ~/.cache/kvtier]."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the profile JSON.")] = False,
) -> None:
    """Measure prefill/decode of a real model, each tier's loads and the host→device copy."""
    options = dict(locals())
    from rich.console import Console

    from kvtier.cli.console import step_progress
    from kvtier.cost.calibration import default_profile_path
    from kvtier.tiers.paths import usable_directory, writable_file
    from kvtier.tiers.registry import check_tier_url

    counts = int_list(
        load_chunks, f"--load-chunks: cannot read {load_chunks!r}; write e.g. 1,2,4,8"
    )
    # every path and URL is checked before the model loads; the checks leave nothing behind
    writable_file(out or default_profile_path(), "--out", parents=True)
    for url in tier or ():
        check_tier_url(url)
    if not tier:
        usable_directory(directory or DEFAULT_DIR, "--dir", keep=False)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kvtier.engines.calibrate import CalibrationPlan, calibrate
    from kvtier.engines.embedded import load_model
    from kvtier.engines.kv_layout import KVLayout
    from kvtier.keys import Namespace
    from kvtier.tiers.registry import open_tier

    plan = config_from(CalibrationPlan, options, compute_budget_s=budget, load_chunks=counts)
    err = Console(stderr=True)
    with err.status("loading the model…"):
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        loaded = load_model(model, dtype, device=dev, tokenizer=False)
    layout = KVLayout.from_model(loaded.model)
    made_dir = None
    urls = list(tier or [])
    if not urls:
        made_dir = directory or DEFAULT_DIR
        made_dir = None if made_dir.exists() else made_dir
        urls = default_tier_urls(
            directory or DEFAULT_DIR, layout.chunk_bytes(chunk_tokens), max(counts)
        )
    # Calibration blocks live in a namespace of their own: they never meet real KV.
    ns = Namespace("kvtier-calibration", "synthetic", layout.dtype_name, 1, 1, 1)
    tiers = []
    try:
        for url in urls:
            opened = open_tier(url, ns.id)
            tiers.append((url, opened))
        with step_progress(err) as progress:
            task = progress.add_task("calibrate", total=len(plan.lengths()) + 6 + len(tiers))
            seen: dict[str, int] = {}

            def step(stage: str, done: int, total: int) -> None:
                advance = done - seen.get(stage, 0)
                seen[stage] = done
                progress.update(task, advance=max(advance, 0), description=stage)

            profile = calibrate(loaded, tiers, plan, step)
    finally:
        for _, opened in tiers:
            opened.close()
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
    path = profile.save(out or default_profile_path())
    if as_json:
        sys.stdout.write(json.dumps(profile.to_dict(), indent=2) + "\n")
        return
    _summary(profile, path)


def _summary(profile, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from kvtier.specs.units import format_bytes

    console = Console()
    m, pre = profile.model, profile.prefill
    console.print(
        f"[bold]{m.model_id}[/] {m.kv_dtype} on {profile.host.get('device', '?')} "
        f"({profile.host.get('processor', '')}, {profile.host.get('threads', '?')} threads)"
    )
    console.print(
        f"prefill ≈ {pre.a * 1e3:.1f} ms + {pre.b * 1e3:.3f} ms/token + "
        f"{pre.c * 1e9:.2f} ns·N·(P+N/2)  (worst fit error {pre.max_rel_error:.0%})"
    )
    pred = Table(title="predicted prefill of N tokens")
    for n in SHOW_TOKENS:
        pred.add_column(f"N={n}", justify="right")
    pred.add_row(*(f"{profile.compute.prefill_seconds(n):.3f} s" for n in SHOW_TOKENS))
    console.print(pred)
    table = Table(title="loads (lookup + read into host buffers, then copy to the model)")
    for col in ("path", "latency", "bandwidth", "fit error", "break-even", "notes"):
        table.add_column(col, justify="left" if col in ("path", "notes") else "right")
    if profile.device_copy is not None:
        c = profile.device_copy
        table.add_row(
            "host→device copy",
            f"{c.latency_s * 1e6:.0f} µs",
            f"{format_bytes(c.bandwidth)}/s",
            f"{c.max_rel_error:.0%}",
            "",
            "",
        )
    cost = profile.cost_model()
    for name, fit in profile.tiers.items():
        even = cost.break_even_tokens(profile.path(name))
        table.add_row(
            name,
            f"{fit.load.latency_s * 1e6:.0f} µs",
            f"{format_bytes(fit.load.bandwidth)}/s",
            f"{fit.load.max_rel_error:.0%}",
            "never" if even is None else f"{even} tokens",
            "; ".join(fit.notes),
        )
    console.print(table)
    console.print(f"profile saved to {path}")


def register(cli: typer.Typer) -> None:
    """Add ``kvtier calibrate`` to the main app."""
    cli.command("calibrate")(calibrate_command)
