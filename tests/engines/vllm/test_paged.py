"""Chunks to and from a paged KV cache shaped like vLLM's CPU backend, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvtier.engines.vllm.paged import (  # noqa: E402
    PagedLayout,
    gather_blocks,
    gather_layers,
    scatter_blocks,
    scatter_layers,
)
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
    scatter_blocks(layout, dst, [1, 5, 11], buf)
    for s, d in zip(src, dst, strict=True):
        for a, b in ((7, 1), (2, 5), (9, 11)):
            assert torch.equal(s[a].view(torch.uint8), d[b].view(torch.uint8))
        untouched = [i for i in range(BLOCKS) if i not in (1, 5, 11)]
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


def test_each_layer_scatters_into_its_own_groups_blocks_and_never_into_the_null_block():
    """Layers of two KV-cache groups (full attention, sliding window): each takes its own
    group's block ids; the sliding window's null block (0) is left alone."""
    src, dst = caches(), [torch.zeros_like(c) for c in caches()]
    layout = PagedLayout.of(src, BLOCK)
    buf = np.empty(layout.chunk_bytes(2 * BLOCK), np.uint8)
    gather_layers(layout, src, [[3, 4]] * layout.layers, buf)
    ids = [[6, 7] if layer % 2 == 0 else [0, 9] for layer in range(layout.layers)]
    scatter_layers(layout, dst, buf, 2, 0, ids)
    for layer, (s, d) in enumerate(zip(src, dst, strict=True)):
        for a, b in zip((3, 4), ids[layer], strict=True):
            if b:
                assert torch.equal(s[a].view(torch.uint8), d[b].view(torch.uint8))
        assert not d[0].any()
