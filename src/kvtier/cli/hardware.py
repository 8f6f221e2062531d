"""The model and hardware flags that ``kvtier plan`` and ``kvtier simulate`` share, read once.

Both commands name a model, a GPU, a host link and spill tiers (DRAM, NVMe, a shared tier) by
preset, which a user profile may add to; unknown names and unreadable sizes are refused with
one-line errors naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvtier.cli.values import byte_size
from kvtier.cost.transfer import SpillTier
from kvtier.plan.inputs import parse_shared
from kvtier.specs import (
    GPU,
    Link,
    ModelSpec,
    Storage,
    get_gpu,
    get_link,
    get_model,
    get_storage,
    load_profile,
)


@dataclass(frozen=True)
class Hardware:
    """The model, GPU and host link the flags name, and the profile's own storage presets
    (None without a profile) that the tiers are looked up among."""

    model: ModelSpec
    gpu: GPU
    link: Link
    storage: dict[str, Storage] | None = None


def read_hardware(
    profile: Path | None,
    model: str,
    kv_dtype: str | None,
    weight_dtype: str | None,
    gpu: str,
    link: str | None,
) -> Hardware:
    """The specs of ``--model`` (with its dtypes), ``--gpu`` and ``--link`` (default: the GPU's
    host link), presets first overridden by ``--profile``'s entries."""
    prof = load_profile(profile) if profile else None
    spec = get_model(model, kv_dtype, weight_dtype, extra=prof.models if prof else None)
    device = get_gpu(gpu, extra=prof.gpus if prof else None)
    host = get_link(link or device.host_link, extra=prof.links if prof else None)
    return Hardware(spec, device, host, prof.storage if prof else None)


def spill_tiers(
    hardware: Hardware,
    dram: str,
    nvme: str,
    nvme_type: str,
    shared: str,
    codec_ratio: float,
    decode_bandwidth: float | None,
) -> list[SpillTier]:
    """The DRAM, NVMe and shared tiers of ``--dram``, ``--nvme`` (``--nvme-type``) and
    ``--shared`` (a zero size or ``none``: no such tier), fast to slow; the codec is on the
    NVMe and shared tiers only."""
    tiers: list[SpillTier] = []
    dram_bytes = byte_size(dram, "--dram")
    if dram_bytes:
        tiers.append(SpillTier("dram", get_storage("dram", hardware.storage), dram_bytes))
    nvme_bytes = byte_size(nvme, "--nvme")
    if nvme_bytes:
        medium = get_storage(nvme_type, hardware.storage)
        tiers.append(SpillTier("nvme", medium, nvme_bytes, codec_ratio, decode_bandwidth))
    shared_tier = parse_shared(shared)
    if shared_tier:
        name, size = shared_tier
        medium = get_storage(name, hardware.storage)
        tiers.append(SpillTier("shared", medium, size, codec_ratio, decode_bandwidth))
    return tiers


__all__ = ["Hardware", "read_hardware", "spill_tiers"]
