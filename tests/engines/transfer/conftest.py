"""Paged KV caches shaped exactly as vLLM's own helpers shape them, for every layout it has.

``create_kv_cache_views`` and ``compute_layout_strides`` (vLLM's ``kv_cache_interface``) turn a
flat allocation into one ``[B, H, N, C]`` view per layer for a ``KVCacheLayout``; the tests run
the transfer engine on those views, so they check the strides vLLM really gives, not a guess.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

LAYOUTS = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC")


def vllm_caches(
    layout: str,
    layers: int = 3,
    blocks: int = 10,
    kind: str = "full",
    block_size: int = 16,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Per-layer views of one random allocation in ``layout`` for a spec of ``kind``:
    ``full`` (2 KV heads of 32, bf16), ``mla`` (one 72-wide latent) or ``padded`` (full
    attention whose pages are padded to the next KiB)."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheLayout,
        KVCacheTensor,
        MLAAttentionSpec,
        compute_layout_strides,
        create_kv_cache_views,
    )

    dtype = torch.bfloat16
    if kind == "mla":
        spec = MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=72, dtype=dtype)
    else:
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=32, dtype=dtype)
    if kind == "padded":
        padded = (spec.page_size_bytes // 1024 + 1) * 1024
        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=2, head_size=32, dtype=dtype,
            page_size_padded=padded,
        )  # fmt: skip
    order = KVCacheLayout[layout]
    strides = compute_layout_strides(spec, blocks, layers, order)
    logical = (layers, blocks, spec.num_heads, spec.block_size, spec.state_content_size_bytes)
    size = sum((n - 1) * s for n, s in zip(logical, strides, strict=True)) + 1
    if kind == "padded":
        size = math.ceil(size / spec.page_size_bytes) * spec.page_size_bytes
    tensor = KVCacheTensor(
        size=size, layers=[f"l{i}" for i in range(layers)],
        layer_stride=strides[0], block_stride=strides[1],
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(-128, 128, (size,), dtype=torch.int8, generator=gen)
    return create_kv_cache_views(raw, spec, blocks, order, tensor)


def page_bytes(view: torch.Tensor, block: int) -> bytes:
    """Block ``block``'s bytes of one layer view, in the view's logical order."""
    return view[block].contiguous().view(torch.uint8).numpy().tobytes()


@pytest.fixture
def caches_of():
    """:func:`vllm_caches` (vLLM must be installed)."""
    pytest.importorskip("vllm")
    return vllm_caches
