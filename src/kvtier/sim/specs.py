"""A simulation from specs: a GPU replica's engine and kvtier's tiers from model and hardware.

The engine's pool is what the GPUs' HBM holds after the weights and the runtime reserve, as
``kvtier plan`` counts it; the tiers are the planner's (host DRAM, NVMe, a shared store) with
their media's read and write speeds, first-byte latencies and the codec's ratio and speed; KV
crosses the GPU's host link both ways. Execution times come from the roofline.
"""

from __future__ import annotations

from kvtier.cost.compute import RooflineCompute
from kvtier.cost.transfer import SpillTier
from kvtier.errors import ConfigError, SpecError
from kvtier.sim.config import EngineSpec, KvtierSpec
from kvtier.sim.tiers import TierSpec
from kvtier.sim.timing import RooflineTimer
from kvtier.specs.hardware import GPU, Link
from kvtier.specs.model import ModelSpec

#: vLLM's default KV block on GPUs, and its OpenAI server's step budget on H100-class GPUs.
GPU_BLOCK_TOKENS = 16
GPU_BATCHED_TOKENS = 8192


def pool_blocks(
    model: ModelSpec,
    gpu: GPU,
    gpus: int,
    block_tokens: int,
    reserve_fraction: float = 0.1,
    reserve_bytes: float = 0.0,
) -> int:
    """Engine blocks the HBM of ``gpus`` tensor-parallel GPUs holds beside weights and reserve."""
    pool = gpu.hbm_bytes * (1 - reserve_fraction) - reserve_bytes - model.weight_bytes(gpus)
    if pool <= 0:
        raise SpecError(
            f"{model.name} ({model.weight_dtype}) leaves no KV room on {gpus} × {gpu.name}; "
            "use more --gpus, a smaller --weight-dtype or a larger GPU"
        )
    blocks = int(pool // (block_tokens * model.kv_bytes_per_token(gpus)))
    if blocks < 1:
        raise SpecError(f"the KV pool of {gpus} × {gpu.name} holds no {block_tokens}-token block")
    return blocks


def engine_from_specs(
    model: ModelSpec,
    gpu: GPU,
    gpus: int = 1,
    *,
    block_tokens: int = GPU_BLOCK_TOKENS,
    max_batched_tokens: int = GPU_BATCHED_TOKENS,
    max_seqs: int = 256,
    reserve_fraction: float = 0.1,
    reserve_bytes: float = 0.0,
    preemption: str = "recompute",
) -> EngineSpec:
    """One replica's engine (its KV per token counts every rank)."""
    return EngineSpec(
        pool_blocks=pool_blocks(model, gpu, gpus, block_tokens, reserve_fraction, reserve_bytes),
        block_tokens=block_tokens,
        kv_bytes_per_token=model.kv_bytes_per_token(gpus) * gpus,
        max_batched_tokens=max_batched_tokens,
        max_seqs=max_seqs,
        preemption=preemption,  # type: ignore[arg-type]
        max_model_len=model.max_context or None,
    )


def timer_from_specs(
    model: ModelSpec,
    gpu: GPU,
    gpus: int = 1,
    *,
    mfu: float = 0.5,
    mbu: float = 0.8,
    budget: int = GPU_BATCHED_TOKENS,
) -> RooflineTimer:
    """Roofline step times of ``gpus`` tensor-parallel GPUs."""
    return RooflineTimer(RooflineCompute(model, gpu, gpus, mfu, mbu), budget=budget)


def tier_specs(
    choices: list[SpillTier],
    gpus: int = 1,
    link: Link | None = None,
    model: ModelSpec | None = None,
) -> tuple[TierSpec, ...]:
    """The simulator's tiers for the planner's choices (a shared tier is shared by replicas).

    Each rank of a tensor-parallel replica reads its share of a chunk: the medium's bandwidth
    is the node's; the host links are per GPU and so scale with ``gpus``. With the host
    ``link``, each tier carries the cost model's load path (as ``kvtier plan`` builds it).
    """
    out = []
    for t in choices:
        if t.codec_ratio <= 0:
            raise ConfigError(f"{t.role}: codec ratio must be positive")
        s = t.storage
        out.append(
            TierSpec(
                name=t.role,
                read_bandwidth=s.read_bandwidth,
                write_bandwidth=s.write_bandwidth,
                latency_s=s.latency_s,
                capacity_bytes=t.capacity_bytes,
                codec_ratio=t.codec_ratio,
                decode_bandwidth=t.decode_bandwidth * gpus if t.decode_bandwidth else None,
                shared=t.role == "shared",
                dwpd=s.dwpd,
                path=None if link is None else t.path(link, sharers=gpus, model=model),
                sharers=gpus,
            )
        )
    return tuple(out)


def kvtier_from_specs(
    choices: list[SpillTier],
    link: Link,
    gpus: int = 1,
    *,
    model: ModelSpec | None = None,
    chunk_tokens: int = 256,
    **options,
) -> KvtierSpec:
    """kvtier's connector over the planner's tiers, KV crossing ``link`` on each GPU."""
    return KvtierSpec(
        tiers=tier_specs(choices, gpus, link, model),
        chunk_tokens=chunk_tokens,
        host_link_bandwidth=link.achieved_bandwidth * gpus,
        host_link_latency_s=link.latency_s,
        sync_first=False,
        **options,
    )


__all__ = [
    "GPU_BATCHED_TOKENS",
    "GPU_BLOCK_TOKENS",
    "engine_from_specs",
    "kvtier_from_specs",
    "pool_blocks",
    "tier_specs",
    "timer_from_specs",
]
