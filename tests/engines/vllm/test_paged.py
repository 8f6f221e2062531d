"""Chunks to and from a paged KV cache shaped like vLLM's CPU backend, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvtier.engines.vllm.paged import PagedLayout, gather_blocks, scatter_blocks  # noqa: E402
from kvtier.errors import ConfigError  # noqa: E402

LAYERS, BLOCKS, HEADS, BLOCK, HEAD_DIM = 3, 12, 3, 16, 64


def caches(dtype=torch.bfloat16, seed=0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM)  # vLLM CPU: [blocks, kv heads, block, 2*head]
    return [torch.randn(shape, generator=gen).to(dtype) for _ in range(LAYERS)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_chunk_gathered_from_some_blocks_scatters_into_others_bit_for_bit(dtype):
    src, dst = caches(dtype), [torch.zeros_like(c) for c in caches(dtype)]
    layout = PagedLayout.of(src, BLOCK)
    assert layout.blocks_per_chunk(3 * BLOCK) == 3
    buf = np.empty(layout.chunk_bytes(3 * BLOCK), np.uint8)
    gather_blocks(layout, src, [7, 2, 9], buf)
    scatter_blocks(layout, dst, [0, 5, 11], buf)
    for s, d in zip(src, dst, strict=True):
        for a, b in ((7, 0), (2, 5), (9, 11)):
            assert torch.equal(s[a].view(torch.uint8), d[b].view(torch.uint8))
        untouched = [i for i in range(BLOCKS) if i not in (0, 5, 11)]
        assert not d[untouched].any()
    # layer-major, block by block: the first block's bytes open the buffer
    assert (
        bytes(buf[: layout.block_bytes])
        == src[0][7].contiguous().view(torch.uint8).numpy().tobytes()
    )


def test_the_chunk_must_be_whole_blocks_and_the_buffer_its_size():
    layout = PagedLayout.of(caches(), BLOCK)
    for bad in (BLOCK - 1, BLOCK + 8):
        with pytest.raises(ConfigError, match="whole vLLM blocks"):
            layout.blocks_per_chunk(bad)
    with pytest.raises(ConfigError, match="needs"):
        gather_blocks(layout, caches(), [1, 2], np.empty(layout.block_bytes, np.uint8))


def test_layers_must_be_alike():
    mixed = caches()
    mixed[1] = mixed[1].to(torch.float32)
    with pytest.raises(ConfigError, match="layers differ"):
        PagedLayout.of(mixed, BLOCK)
    with pytest.raises(ConfigError, match="no KV cache"):
        PagedLayout.of([], BLOCK)
