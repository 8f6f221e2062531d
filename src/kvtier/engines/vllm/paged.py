"""KV chunks to and from vLLM's paged KV cache, block by block, with one copy each way.

vLLM keeps each layer's KV in a tensor of ``num_blocks`` fixed-size blocks of ``block_size``
tokens (the CPU backend: ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``, whose
element order inside a block its attention kernels choose). kvtier stores a chunk of
``chunk_tokens`` tokens as the bytes of the blocks that hold it, for every layer, layer-major:
``[layers][blocks of the chunk][one block's bytes]``. A block's bytes are copied whole and never
reinterpreted, so whatever order the kernels use inside a block comes back bit for bit; the
namespace of such chunks names that layout (backend, block size, dtype, geometry), so no other
engine or layout ever reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvtier.errors import ConfigError


@dataclass(frozen=True)
class PagedLayout:
    """The shape of vLLM's paged KV cache as kvtier moves it: layers, tokens per block, and the
    shape and dtype of one block of one layer."""

    layers: int
    block_size: int
    block_shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, caches: Sequence[torch.Tensor], block_size: int) -> PagedLayout:
        """The layout of ``caches`` (one tensor per layer, blocks first) holding ``block_size``
        tokens per block; every layer must be alike."""
        if not caches:
            raise ConfigError("no KV cache tensors: the engine registered none")
        first = caches[0]
        for cache in caches[1:]:
            if cache.shape != first.shape or cache.dtype != first.dtype:
                raise ConfigError(
                    f"KV cache layers differ ({tuple(cache.shape)} {cache.dtype} vs "
                    f"{tuple(first.shape)} {first.dtype}): kvtier moves uniform layers only"
                )
        if block_size < 1:
            raise ConfigError(f"block size must be at least 1 token, got {block_size}")
        return cls(len(caches), block_size, tuple(first.shape[1:]), first.dtype)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one layer."""
        n = self.dtype.itemsize
        for d in self.block_shape:
            n *= d
        return n

    def blocks_per_chunk(self, chunk_tokens: int) -> int:
        """vLLM blocks in a kvtier chunk (the chunk must be whole blocks)."""
        if chunk_tokens < self.block_size or chunk_tokens % self.block_size:
            raise ConfigError(
                f"kvtier chunks of {chunk_tokens} tokens are not whole vLLM blocks of "
                f"{self.block_size}: use a multiple of the block size"
            )
        return chunk_tokens // self.block_size

    def chunk_bytes(self, chunk_tokens: int) -> int:
        """Bytes of one chunk, every layer included."""
        return self.layers * self.blocks_per_chunk(chunk_tokens) * self.block_bytes


def byte_views(caches: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Each layer's cache as a numpy ``[num_blocks, block bytes]`` uint8 array (no copy).

    Blocks are moved as whole byte rows with numpy slice copies (plain memcpy): torch's
    ``index_copy_`` and ``index_select`` take a slow element-wise path for these shapes.
    """
    return [c.view(torch.uint8).numpy().reshape(c.shape[0], -1) for c in caches]


def _chunk_rows(layout: PagedLayout, blocks: int, buf) -> np.ndarray:
    """``buf`` (a contiguous byte buffer of one chunk) as ``[layers, blocks, block bytes]``."""
    flat = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    need = layout.layers * blocks * layout.block_bytes
    if flat.size != need:
        raise ConfigError(
            f"a chunk of {blocks} blocks needs {need} bytes, the buffer has {flat.size}"
        )
    return flat.reshape(layout.layers, blocks, layout.block_bytes)


def _views(caches) -> list[np.ndarray]:
    if caches and isinstance(caches[0], np.ndarray):
        return list(caches)
    return byte_views(caches)


def gather_blocks(layout: PagedLayout, caches, block_ids: Sequence[int], out) -> None:
    """Copy blocks ``block_ids`` of every layer into ``out``, a chunk's byte buffer.

    ``caches``: the per-layer tensors, or their :func:`byte_views`."""
    gather_layers(layout, caches, [block_ids] * layout.layers, out)


def gather_layers(layout: PagedLayout, caches, ids_by_layer: Sequence[Sequence[int]], out) -> None:
    """Copy each layer's blocks ``ids_by_layer[layer]`` (one chunk's worth each: layers of
    different KV-cache groups use different block tables) into ``out``."""
    rows = _chunk_rows(layout, len(ids_by_layer[0]), out)
    if not rows.flags.writeable:
        _refuse_readonly()
    for layer, cache in enumerate(_views(caches)):
        dst = rows[layer]
        for j, block in enumerate(ids_by_layer[layer]):
            dst[j] = cache[block]


def scatter_blocks(layout: PagedLayout, caches, block_ids: Sequence[int], chunk) -> None:
    """Copy a chunk's bytes (``chunk``, as :func:`gather_blocks` wrote them) into blocks
    ``block_ids`` of every layer."""
    scatter_layers(layout, caches, chunk, len(block_ids), 0, [block_ids] * layout.layers)


def scatter_layers(
    layout: PagedLayout,
    caches,
    chunk,
    blocks_per_chunk: int,
    skip: int,
    ids_by_layer: Sequence[Sequence[int]],
) -> None:
    """Copy blocks ``skip:skip+n`` of a chunk of ``blocks_per_chunk`` blocks into each layer's
    ``n`` blocks ``ids_by_layer[layer]`` (a load may need only part of a chunk; layers of
    different KV-cache groups use different block tables); vLLM's null block (id 0, a sliding
    window's blocks outside it) is never written."""
    count = len(ids_by_layer[0])
    if skip < 0 or skip + count > blocks_per_chunk:
        raise ConfigError(f"blocks {skip}..{skip + count} are not in a chunk of {blocks_per_chunk}")
    rows = _chunk_rows(layout, blocks_per_chunk, chunk)
    for layer, cache in enumerate(_views(caches)):
        src = rows[layer]
        for j, block in enumerate(ids_by_layer[layer]):
            if block:
                cache[block] = src[skip + j]


def _refuse_readonly() -> None:
    raise ConfigError("the chunk buffer to gather into is read-only")


__all__ = [
    "PagedLayout",
    "byte_views",
    "gather_blocks",
    "gather_layers",
    "scatter_blocks",
    "scatter_layers",
]
