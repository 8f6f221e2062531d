"""The transfer engine on CPU tensors: every vLLM layout, MLA and padded pages, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from kvtier.engines.transfer import (  # noqa: E402
    LoadProgress,
    PagedKV,
    Placement,
    open_transfer_engine,
)
from kvtier.errors import ConfigError  # noqa: E402

LAYOUTS = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC")
KINDS = [(layout, "full") for layout in LAYOUTS]
KINDS += [(layout, "mla") for layout in LAYOUTS]
KINDS += [(layout, "padded") for layout in ("LBNHC", "LBHNC", "BLNHC", "BLHNC")]
BLOCK = 16


def page_bytes(view, block: int) -> bytes:
    """Block ``block``'s bytes of one layer view, in the view's logical order."""
    return view[block].contiguous().view(torch.uint8).numpy().tobytes()


def snapshot(views) -> list[list[bytes]]:
    return [[page_bytes(v, b) for b in range(v.shape[0])] for v in views]


@pytest.mark.parametrize(("layout", "kind"), KINDS)
def test_blocks_gathered_in_one_layout_scatter_back_bit_for_bit_and_nothing_else(
    layout, kind, caches_of
):
    src = caches_of(layout, kind=kind, seed=1)
    dst = caches_of(layout, kind=kind, seed=2)
    before = snapshot(dst)
    raw_before = dst[0].untyped_storage().nbytes()
    engine = open_transfer_engine(src, BLOCK, 3 * BLOCK)
    back = open_transfer_engine(dst, BLOCK, 3 * BLOCK)
    assert engine.chunk_bytes == 3 * sum(PagedKV.of(src, BLOCK).page_bytes)
    bufs = engine.take_buffers(2)
    places = [Placement.same([7, 2, 9], 3), Placement.same([4, 5, 6], 3)]
    engine.to_host(places, bufs)
    targets = [Placement.same([1, 5, 8], 3), Placement.same([3, 0, 9], 3)]  # 0: null block
    progress = LoadProgress(3)
    back.to_device(targets, bufs, progress)
    assert all(progress.layer_ready(i) for i in range(3))
    after = snapshot(dst)
    moved = {1: 7, 5: 2, 8: 9, 3: 4, 9: 6}
    source = snapshot(src)
    for layer in range(3):
        for block in range(dst[layer].shape[0]):
            want = source[layer][moved[block]] if block in moved else before[layer][block]
            assert after[layer][block] == want, (layer, block)
    assert dst[0].untyped_storage().nbytes() == raw_before
    # the chunk is layer-major: layer 1 of the first chunk is its own byte range
    start, end = engine.kv.layer_span(1, 3)
    got = np.asarray(bufs[0][start:end]).tobytes()
    assert got == b"".join(b"".join(_fragments(src[1], b)) for b in (7, 2, 9))
    engine.give_buffers(bufs)


def _fragments(view, block) -> list[bytes]:
    """A page's bytes in memory order (how the engine lays them in a chunk)."""
    pages = PagedKV.of([view], BLOCK).layers[0]
    storage = view.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    base = pages.offset + block * pages.block_stride
    out = []
    counts = [n for n, _ in pages.grid] or [1]
    strides = [s for _, s in pages.grid] or [0]
    for i in range(int(np.prod(counts))):
        off, rest = base, i
        for n, s in zip(reversed(counts), reversed(strides), strict=True):
            off += (rest % n) * s
            rest //= n
        out.append(flat[off : off + pages.fragment].numpy().tobytes())
    return out


def test_a_load_of_a_chunks_tail_fills_only_the_blocks_it_names(caches_of):
    src, dst = caches_of("LBNHC", seed=3), caches_of("LBNHC", seed=4)
    engine = open_transfer_engine(src, BLOCK, 4 * BLOCK)
    back = open_transfer_engine(dst, BLOCK, 4 * BLOCK)
    (buf,) = engine.take_buffers(1)
    engine.to_host([Placement.same([1, 2, 3, 4], 3)], [buf])
    back.to_device([Placement.same([8, 9], 3, skip=2)], [buf])
    for layer in range(3):
        assert page_bytes(dst[layer], 8) == page_bytes(src[layer], 3)
        assert page_bytes(dst[layer], 9) == page_bytes(src[layer], 4)


def test_each_layer_takes_its_own_groups_blocks(caches_of):
    src, dst = caches_of("LBHNC", seed=5), caches_of("LBHNC", seed=6)
    engine = open_transfer_engine(src, BLOCK, 2 * BLOCK)
    back = open_transfer_engine(dst, BLOCK, 2 * BLOCK)
    (buf,) = engine.take_buffers(1)
    engine.to_host([Placement(((1, 2), (3, 4), (5, 6)))], [buf])
    back.to_device([Placement(((7, 8), (0, 9), (2, 3)))], [buf])
    assert page_bytes(dst[0], 7) == page_bytes(src[0], 1)
    assert page_bytes(dst[1], 9) == page_bytes(src[1], 4)
    assert page_bytes(dst[2], 2) == page_bytes(src[2], 5)


def test_placements_that_do_not_fit_are_refused_with_a_reason(caches_of):
    engine = open_transfer_engine(caches_of("LBNHC"), BLOCK, 2 * BLOCK)
    (buf,) = engine.take_buffers(1)
    with pytest.raises(ConfigError, match="not in a chunk of 2"):
        engine.to_host([Placement.same([1, 2, 3], 3)], [buf])
    with pytest.raises(ConfigError, match="not in the engine's 10 blocks"):
        engine.to_host([Placement.same([1, 10], 3)], [buf])
    with pytest.raises(ConfigError, match="names 2 layers"):
        engine.to_host([Placement.same([1, 2], 2)], [buf])
    with pytest.raises(ConfigError, match="needs"):
        engine.to_host([Placement.same([1, 2], 3)], [np.empty(16, np.uint8)])
    with pytest.raises(ConfigError, match="whole blocks of 16"):
        open_transfer_engine(caches_of("LBNHC"), BLOCK, 24)


def test_layers_on_different_devices_or_pools_are_refused(caches_of):
    caches = caches_of("LBNHC")
    with pytest.raises(ConfigError, match="different block counts"):
        PagedKV.of([caches[0], caches[1][:5]], BLOCK)
    with pytest.raises(ConfigError, match="no KV cache"):
        PagedKV.of([], BLOCK)
    with pytest.raises(ConfigError, match="blocks as the first"):
        PagedKV.of([torch.zeros(8)], BLOCK)
    with pytest.raises(ConfigError, match="CPU and CUDA devices"):
        open_transfer_engine([torch.zeros((4, 8), device="meta")], BLOCK, BLOCK)
