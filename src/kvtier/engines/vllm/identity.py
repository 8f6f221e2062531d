"""The namespace of the KV a vLLM engine computes: which model, which weights, which bytes.

vLLM's own block hashes carry no model identity, so kvtier keys chunks in its own namespace:
the model (folder name or ``model_id``), a fingerprint of its weight files, the KV dtype, the
geometry, and the layout of a block's bytes — vLLM's CPU attention picks the element order
inside a block by instruction set (``amx``, ``vec``, …) and block size, so that enters too, and a
block written by an AMX host is never read by an AVX2 one. Both halves of the connector compute
the same namespace from the same ``VllmConfig``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.engines.embedded import fingerprint_files
from kvtier.errors import ConfigError
from kvtier.keys import Namespace
from kvtier.specs.model import KVIdentity

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass(frozen=True)
class EngineGeometry:
    """What the connector needs to know of the engine's KV (``kv_heads``: one rank's)."""

    layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str  # torch dtype name, e.g. "bfloat16"
    itemsize: int
    layout: str
    tp_size: int = 1

    def blocks_per_chunk(self, chunk_tokens: int) -> int:
        """vLLM blocks in one chunk of ``chunk_tokens`` tokens (a whole number of them)."""
        if chunk_tokens <= 0 or chunk_tokens % self.block_size:
            raise ConfigError(
                f"chunk_tokens={chunk_tokens} is not a multiple of vLLM's block size "
                f"{self.block_size}"
            )
        return chunk_tokens // self.block_size

    def chunk_bytes(self, chunk_tokens: int) -> int:
        """Bytes of one rank's part of a chunk of ``chunk_tokens`` tokens, every layer, K and V."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.itemsize * chunk_tokens

    def identity(self, model_id: str, fingerprint: str) -> KVIdentity:
        """This KV's identity as the model ``model_id`` with weights ``fingerprint`` has it."""
        return KVIdentity(
            model_id, fingerprint, self.dtype, self.layers, self.kv_heads, self.head_dim
        )


def model_fingerprint(folder: str | Path) -> str:
    """The weights fingerprint of a model folder (kvtier's converted folders record theirs)."""
    path = Path(folder)
    source = path / "kvtier-source.json"
    if source.is_file():
        info = json.loads(source.read_text())
        if info.get("fingerprint"):
            return str(info["fingerprint"])
    if path.is_dir():
        files = [p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES]
        if files:
            return fingerprint_files(files)
    raise ConfigError(
        f"cannot fingerprint the weights of {folder!r} (not a local folder with weight files): "
        'give "fingerprint" (a revision or hash) in kv_connector_extra_config'
    )


def attention_isa(dtype: Any, block_size: int, head_size: int, cache_dtype: str) -> str:
    """The instruction set vLLM's CPU attention uses for this KV (it decides the block layout)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError:  # another platform's backend: its name is enough
        return "native"
    return str(_get_attn_isa(dtype, block_size, head_size, cache_dtype))


def layout_name(vllm_config: Any, kv_cache_config: Any, isa: str, block_size: int) -> str:
    """The name of the engine's KV block layout, which the namespace carries: on vLLM's CPU
    backend its attention ISA (which decides the order inside a block); elsewhere the
    platform and vLLM's canonical format id of the resolved ``KVCacheLayout``."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return f"vllm-cpu-{isa}-block{block_size}"
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.canonical_mapping import (
        canonical_format_id,
    )

    name = getattr(kv_cache_config, "kv_cache_layout", None)
    if name is None:
        name = vllm_config.cache_config.kv_cache_layout
    if name is None:
        raise ConfigError(
            "vLLM has not resolved its KV cache layout when kvtier's connector starts: set "
            "VLLM_KV_CACHE_LAYOUT (e.g. LBNHC) so both halves name the same layout"
        )
    device = str(getattr(current_platform, "device_name", "gpu") or "gpu")
    return f"vllm-{device}-{canonical_format_id(str(name))}-block{block_size}"


def engine_geometry(vllm_config: Any, kv_cache_config: Any = None) -> EngineGeometry:
    """The KV geometry and block layout of the engine ``vllm_config`` describes
    (``kv_cache_config``: vLLM's, which names the resolved layout off the CPU backend)."""
    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    cache = vllm_config.cache_config
    if parallel.pipeline_parallel_size != 1:
        raise ConfigError(
            "kvtier's vLLM connector supports tensor parallelism, not pipeline parallelism "
            f"(pipeline_parallel_size={parallel.pipeline_parallel_size})"
        )
    dcp = int(getattr(parallel, "decode_context_parallel_size", 1) or 1)
    if dcp != 1:
        raise ConfigError(
            f"kvtier's vLLM connector does not split KV by context (decode_context_parallel_size"
            f"={dcp})"
        )
    dtype = model.dtype
    head = model.get_head_size()
    block_size = int(cache.block_size)
    cache_dtype = str(cache.cache_dtype)
    if cache_dtype not in ("auto", "bfloat16", "float16", "half"):
        raise ConfigError(
            "kvtier's vLLM connector moves KV in the model's dtype (kv_cache_dtype auto, "
            f"bfloat16 or float16), not {cache_dtype}"
        )
    isa = attention_isa(dtype, block_size, head, cache_dtype)
    name = str(dtype).removeprefix("torch.")
    return EngineGeometry(
        layers=model.get_num_layers(parallel),
        kv_heads=model.get_num_kv_heads(parallel),
        head_dim=head,
        block_size=block_size,
        dtype=name,
        itemsize=dtype.itemsize,
        layout=layout_name(vllm_config, kv_cache_config, isa, block_size),
        tp_size=int(parallel.tensor_parallel_size),
    )


def worker_rank(geometry: EngineGeometry) -> int:
    """This worker's tensor-parallel rank (called in a worker process, after vLLM set up its
    process groups; 0 without tensor parallelism)."""
    if geometry.tp_size == 1:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def engine_namespace(
    vllm_config: Any,
    geometry: EngineGeometry,
    model_id: str | None = None,
    fingerprint: str | None = None,
    tenant: str = "",
) -> Namespace:
    """The namespace of the KV this engine computes (every rank's: a rank's parts are keyed
    apart by :class:`~kvtier.engines.vllm.shards.Shards`)."""
    folder = str(vllm_config.model_config.model)
    identity = geometry.identity(
        model_id or Path(folder).name or folder, fingerprint or model_fingerprint(folder)
    )
    return Namespace.of(identity, layout=geometry.layout, tp_size=geometry.tp_size, tenant=tenant)


__all__ = [
    "EngineGeometry",
    "attention_isa",
    "engine_geometry",
    "engine_namespace",
    "layout_name",
    "worker_rank",
]
