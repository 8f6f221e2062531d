"""Options that several commands take with the same flag and help: one definition each.

Each alias is a typer ``Annotated`` type; a command gives it a parameter name and a default,
e.g. ``json_out: JsonOnStdout = False``. typer copies the option for every command that uses
it, so sharing one is safe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

#: Tier sizes ``kvtier plan`` and ``kvtier simulate`` assume per replica when none is given.
DEFAULT_DRAM = "256GB"
DEFAULT_NVME = "3.84TB"
DEFAULT_NVME_TYPE = "nvme-gen4"

# What a command prints.
JsonOnStdout = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")]
JsonToStdout = Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")]
JsonFigures = Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")]
Strict = Annotated[bool, typer.Option(help="Exit 1 when any target is missed.")]

# The model and hardware flags of ``kvtier plan`` and ``kvtier simulate``.
ModelPreset = Annotated[
    str, typer.Option("--model", "-m", help="Preset name or path of a HF config.json.")
]
GpuPreset = Annotated[str, typer.Option("--gpu", "-g", help="GPU preset or profile entry.")]
LinkPreset = Annotated[
    str | None, typer.Option("--link", help="Host link preset (default: the GPU's).")
]
KvDtype = Annotated[str | None, typer.Option("--kv-dtype", help="KV dtype: bf16, fp16, fp8.")]
WeightDtype = Annotated[
    str | None, typer.Option("--weight-dtype", help="Weight dtype: bf16, fp8, int4.")
]
Mfu = Annotated[float, typer.Option("--mfu", help="Prefill FLOP utilisation.")]
Mbu = Annotated[float, typer.Option("--mbu", help="Decode HBM bandwidth utilisation.")]
NvmeType = Annotated[str, typer.Option("--nvme-type", help="Storage preset of the NVMe tier.")]
Gpus = Annotated[int, typer.Option("--gpus", "-n", help="GPUs per replica (tensor parallel size).")]
DramSize = Annotated[
    str, typer.Option("--dram", help="DRAM tier size for KV on the host, per replica (0: none).")
]
NvmeSize = Annotated[str, typer.Option("--nvme", help="NVMe tier size per replica (0: none).")]
SharedTier = Annotated[
    str, typer.Option("--shared", help="Shared tier NAME[:SIZE], e.g. redis:1TB, net-100g.")
]
CodecRatio = Annotated[
    float, typer.Option("--codec-ratio", help="Compression raw/stored on NVMe and shared tiers.")
]
CodecBandwidth = Annotated[
    str | None,
    typer.Option("--codec-bandwidth", help="Decode rate per GPU, raw bytes/s (e.g. 8GB)."),
]
HbmReserve = Annotated[
    str,
    typer.Option(
        "--reserve",
        help="HBM kept from KV per GPU for CUDA context, graphs, activations, "
        "fragmentation: 10%, 0.1 or 8GiB.",
    ),
]
HardwareProfile = Annotated[
    Path | None, typer.Option("--profile", help="TOML/YAML file of user models/hardware.")
]

# The real model the measuring commands load.
EmbeddedModel = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="embedded (SmolLM2-135M), a .gguf file, a local folder or hub id."
    ),
]
ModelDtype = Annotated[str, typer.Option(help="Model (and KV) dtype: bf16, fp16 or fp32.")]
TorchDevice = Annotated[
    str | None, typer.Option(help="Torch device (default: cuda when available, else cpu).")
]

# The tiers ``kvtier bench storage`` and ``kvtier calibrate`` measure, and their chunks.
MeasuredTiers = Annotated[
    list[str] | None,
    typer.Option(
        "--tier",
        help="Tier URL to measure (repeatable), e.g. 'memory://?size=2GiB' or "
        "'slab:///nvme/kvbench?size=4GiB'. Default: memory + a slab:// disk tier in --dir.",
    ),
]
ChunkTokens = Annotated[int, typer.Option(help="Tokens per KV chunk (block).")]

# How the HF measuring commands (``kvtier run --engine hf``, ``kvtier bench ttft``) decide.
CalibrationFile = Annotated[
    Path | None,
    typer.Option(
        "--profile", help="Calibration profile to use when it fits (default: `kvtier calibrate`'s)."
    ),
]
Recalibrate = Annotated[
    bool, typer.Option("--calibrate", help="Measure a quick profile now, even if one fits.")
]
ExactPrefill = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Prefill in chunk-aligned forwards, with and without kvtier: logits then agree bit "
        "for bit; one forward over the new tokens is the faster default.",
    ),
]

__all__ = [
    "DEFAULT_DRAM",
    "DEFAULT_NVME",
    "DEFAULT_NVME_TYPE",
    "CalibrationFile",
    "ChunkTokens",
    "CodecBandwidth",
    "CodecRatio",
    "DramSize",
    "EmbeddedModel",
    "ExactPrefill",
    "GpuPreset",
    "Gpus",
    "HardwareProfile",
    "HbmReserve",
    "JsonFigures",
    "JsonOnStdout",
    "JsonToStdout",
    "KvDtype",
    "LinkPreset",
    "Mbu",
    "MeasuredTiers",
    "Mfu",
    "ModelDtype",
    "ModelPreset",
    "NvmeSize",
    "NvmeType",
    "Recalibrate",
    "SharedTier",
    "Strict",
    "TorchDevice",
    "WeightDtype",
]
