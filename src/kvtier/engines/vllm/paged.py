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


def _chunk_view(layout: PagedLayout, blocks: int, buf) -> torch.Tensor:
    """``buf`` (a contiguous byte buffer of one chunk) as ``[layers, blocks, *block_shape]``."""
    flat = torch.frombuffer(memoryview(buf).cast("B"), dtype=torch.uint8)
    need = layout.layers * blocks * layout.block_bytes
    if flat.numel() != need:
        raise ConfigError(
            f"a chunk of {blocks} blocks needs {need} bytes, the buffer has {flat.numel()}"
        )
    return flat.view(layout.dtype).view(layout.layers, blocks, *layout.block_shape)


def gather_blocks(
    layout: PagedLayout, caches: Sequence[torch.Tensor], block_ids: Sequence[int], out
) -> None:
    """Copy blocks ``block_ids`` of every layer into ``out``, a chunk's byte buffer."""
    ids = torch.as_tensor(list(block_ids), dtype=torch.long)
    view = _chunk_view(layout, len(ids), out)
    for layer, cache in enumerate(caches):
        torch.index_select(cache, 0, ids, out=view[layer])


def scatter_blocks(
    layout: PagedLayout, caches: Sequence[torch.Tensor], block_ids: Sequence[int], chunk
) -> None:
    """Copy a chunk's bytes (``chunk``, as :func:`gather_blocks` wrote them) into blocks
    ``block_ids`` of every layer."""
    ids = torch.as_tensor(list(block_ids), dtype=torch.long)
    view = _chunk_view(layout, len(ids), chunk)
    for layer, cache in enumerate(caches):
        cache.index_copy_(0, ids, view[layer])


__all__ = ["PagedLayout", "gather_blocks", "scatter_blocks"]
