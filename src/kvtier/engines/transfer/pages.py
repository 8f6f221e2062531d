"""Where each layer's page of every block lies in an engine's KV memory, read off its tensors.

An engine hands the transfer engine one tensor view per layer whose first dimension is the
block (vLLM's per-layer ``[B, H, N, C]`` views in any of its ``KVCacheLayout`` orders, its CPU
backend's ``[B, H, N, 2·D]``, an MLA latent cache, a padded page). A layer's page of block
``b`` is then a set of byte fragments: ``fragment`` contiguous bytes, repeated over a small grid
of (count, stride) steps, starting ``offset + b · block_stride`` bytes into the tensor's
storage. Layer-compact layouts give one fragment per page; layouts that put heads outside the
block (LHBNC) or layers inside it (BHLNC) give one per head. The grid is read from the view's
strides, so no backend's shape is guessed: whatever vLLM's helpers built, its bytes are found.

kvtier stores a chunk layer-major, ``[layers][blocks of the chunk][one page]``, a page's
fragments in memory order; a layer is one byte range of a chunk. The order is fixed by the
layout, which the namespace names, so no other layout ever reads the bytes.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.errors import ConfigError


@dataclass(frozen=True)
class LayerPages:
    """One layer's pages: ``blocks`` pages, page ``b`` made of the fragments at
    ``offset + b·block_stride + Σ i_k·stride_k`` (for each grid step ``(count_k, stride_k)``),
    ``fragment`` bytes each, offsets in bytes from the start of the tensor's storage."""

    blocks: int
    offset: int
    block_stride: int
    grid: tuple[tuple[int, int], ...]
    fragment: int

    @classmethod
    def of(cls, tensor: Any) -> LayerPages:
        """The pages of ``tensor`` (a torch tensor or view, dimension 0 the block)."""
        if tensor.dim() < 2:
            raise ConfigError(
                f"a KV cache layer of shape {tuple(tensor.shape)} has no per-block page: "
                "kvtier needs blocks as the first dimension"
            )
        item = tensor.element_size()
        dims = [
            (int(n), int(s) * item)
            for n, s in zip(tensor.shape[1:], tensor.stride()[1:], strict=True)
            if n > 1
        ]
        dims.sort(key=lambda d: d[1], reverse=True)  # memory order, outermost first
        fragment = item
        while dims and dims[-1][1] == fragment:  # merge the contiguous tail into one run
            fragment *= dims.pop()[0]
        for (_, outer), (count, inner) in itertools.pairwise(dims):
            if inner * count > outer:
                raise ConfigError(
                    f"a KV cache layer's strides {tuple(tensor.stride())} overlap: kvtier "
                    "moves pages whose bytes are distinct"
                )
        if dims and dims[-1][1] < fragment:
            raise ConfigError(
                f"a KV cache layer's strides {tuple(tensor.stride())} interleave its "
                "fragments: kvtier moves whole byte runs"
            )
        return cls(
            blocks=int(tensor.shape[0]),
            offset=int(tensor.storage_offset()) * item,
            block_stride=int(tensor.stride(0)) * item,
            grid=tuple(dims),
            fragment=fragment,
        )

    @property
    def page_bytes(self) -> int:
        """Bytes of one page (its fragments, no padding)."""
        return self.fragment * math.prod(n for n, _ in self.grid)

    @property
    def fragments(self) -> int:
        """Fragments per page."""
        return math.prod(n for n, _ in self.grid)

    @property
    def view_shape(self) -> tuple[int, ...]:
        """The shape of the byte view ``[blocks, *grid counts, fragment]``."""
        return (self.blocks, *(n for n, _ in self.grid), self.fragment)

    @property
    def view_strides(self) -> tuple[int, ...]:
        """The byte strides of :attr:`view_shape`."""
        return (self.block_stride, *(s for _, s in self.grid), 1)

    @property
    def extent(self) -> int:
        """Bytes from :attr:`offset` past the last byte of the last page."""
        last = sum((n - 1) * s for n, s in self.grid) + self.fragment
        return (self.blocks - 1) * self.block_stride + last


@dataclass(frozen=True)
class PagedKV:
    """An engine's paged KV as kvtier moves it: each layer's pages, tokens per block, and the
    device the bytes live on (``cpu``, ``cuda:0``, …)."""

    layers: tuple[LayerPages, ...]
    block_size: int
    device: str

    @classmethod
    def of(cls, caches: Sequence[Any], block_size: int) -> PagedKV:
        """The paged KV of ``caches`` (one tensor view per layer, blocks first)."""
        if not caches:
            raise ConfigError("no KV cache tensors: the engine registered none")
        if block_size < 1:
            raise ConfigError(f"block size must be at least 1 token, got {block_size}")
        devices = {str(c.device) for c in caches}
        if len(devices) > 1:
            raise ConfigError(f"KV cache layers live on several devices: {sorted(devices)}")
        layers = tuple(LayerPages.of(c) for c in caches)
        blocks = {p.blocks for p in layers}
        if len(blocks) > 1:
            raise ConfigError(f"KV cache layers hold different block counts: {sorted(blocks)}")
        return cls(layers, block_size, devices.pop())

    @property
    def num_layers(self) -> int:
        """Layers."""
        return len(self.layers)

    @property
    def num_blocks(self) -> int:
        """Blocks in the engine's pool."""
        return self.layers[0].blocks

    @functools.cached_property
    def page_bytes(self) -> tuple[int, ...]:
        """Each layer's page bytes."""
        return tuple(p.page_bytes for p in self.layers)

    def blocks_per_chunk(self, chunk_tokens: int) -> int:
        """Blocks in a kvtier chunk (the chunk must be whole blocks)."""
        if chunk_tokens < self.block_size or chunk_tokens % self.block_size:
            raise ConfigError(
                f"kvtier chunks of {chunk_tokens} tokens are not whole blocks of "
                f"{self.block_size}: use a multiple of the block size"
            )
        return chunk_tokens // self.block_size

    def chunk_bytes(self, blocks: int) -> int:
        """Bytes of a chunk of ``blocks`` blocks, every layer included."""
        return blocks * sum(self.page_bytes)

    def layer_span(self, layer: int, blocks: int) -> tuple[int, int]:
        """The byte range ``[start, end)`` of ``layer`` in a chunk of ``blocks`` blocks."""
        start = blocks * sum(self.page_bytes[:layer])
        return start, start + blocks * self.page_bytes[layer]


__all__ = ["LayerPages", "PagedKV"]
