"""A paged KV cache laid out as vLLM lays it out, built with torch alone (no vLLM needed).

vLLM's standard layouts (RFC #42082) name a stride order of the logical axes ``[L, B, H, N,
C]`` (layers, blocks, KV heads, tokens in a block, one token's K and V bytes of a head): the
first letter is outermost in memory. One allocation holds every layer; each layer is a
``[B, H, N, C]`` view of it. ``kvtier bench transfer`` builds its caches so, on the GPU machine
that has no vLLM, and the tests check the views against vLLM's own helpers where vLLM is
installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvtier.errors import ConfigError

#: The six standard orders, by name: the logical axis (0 L, 1 B, 2 H, 3 N, 4 C) in each
#: physical position, outermost first.
LAYOUT_ORDERS: dict[str, tuple[int, ...]] = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


@dataclass(frozen=True)
class KVShape:
    """A paged KV pool: layers, blocks, KV heads, tokens per block, head dim and dtype."""

    layers: int
    blocks: int
    kv_heads: int
    block_size: int
    head_dim: int
    dtype: torch.dtype = torch.bfloat16

    @property
    def content_bytes(self) -> int:
        """Bytes of one token's K and V of one head."""
        return 2 * self.head_dim * self.dtype.itemsize

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of one layer."""
        return self.kv_heads * self.block_size * self.content_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the whole pool."""
        return self.layers * self.blocks * self.page_bytes


def layout_strides(shape: KVShape, layout: str) -> tuple[int, ...]:
    """Byte strides of the logical axes ``[L, B, H, N, C]`` in ``layout`` (dense, no padding)."""
    order = LAYOUT_ORDERS.get(layout)
    if order is None:
        raise ConfigError(f"unknown KV layout {layout!r}; use one of {', '.join(LAYOUT_ORDERS)}")
    sizes = (shape.layers, shape.blocks, shape.kv_heads, shape.block_size, shape.content_bytes)
    strides = [0] * 5
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= sizes[axis]
    return tuple(strides)


def paged_kv(
    shape: KVShape, layout: str, device: str = "cpu", seed: int = 0
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A random pool in ``layout`` on ``device``: the flat allocation and one ``[B, H, N, D·2]``
    view per layer in ``shape.dtype``."""
    strides = layout_strides(shape, layout)
    raw = torch.empty(shape.nbytes, dtype=torch.uint8, device=device)
    gen = torch.Generator(device=raw.device).manual_seed(seed)
    raw.random_(0, 256, generator=gen)
    size = (shape.layers, shape.blocks, shape.kv_heads, shape.block_size, shape.content_bytes)
    whole = raw.as_strided(size, strides)
    return raw, [whole[layer].view(shape.dtype) for layer in range(shape.layers)]


__all__ = ["LAYOUT_ORDERS", "KVShape", "layout_strides", "paged_kv"]
