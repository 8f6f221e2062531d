"""The CUDA transfer engine: it imports and refuses cleanly without a GPU; on a GPU (marked
``gpu``, skipped elsewhere) it round-trips every layout, through a ring smaller than a load,
and a layer-by-layer load makes each layer usable exactly when marked."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvtier.bench.transfer_kv import LAYOUT_ORDERS, KVShape, paged_kv  # noqa: E402
from kvtier.engines.transfer import LoadProgress, PagedKV, Placement  # noqa: E402
from kvtier.engines.transfer.cuda import CudaTransfer, require_cuda  # noqa: E402
from kvtier.errors import ConfigError  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (scripts/gpu_check.sh)")
SHAPE = KVShape(layers=4, blocks=33, kv_heads=2, block_size=16, head_dim=64)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
def test_without_a_gpu_the_cuda_engine_refuses_in_one_line():
    with pytest.raises(ConfigError, match="sees no CUDA device") as err:
        require_cuda("cuda:0")
    assert "\n" not in str(err.value)
    _, views = paged_kv(SHAPE, "LBNHC")
    kv = PagedKV(PagedKV.of(views, 16).layers, 16, "cuda:0")
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        CudaTransfer(kv, views, 32, 1 << 20)


def test_a_cpu_device_is_not_a_cuda_one():
    with pytest.raises(ConfigError, match="not a CUDA device"):
        require_cuda("cpu")


def _bytes(view, block):
    return view[block].contiguous().view(torch.uint8)


def _assert_moved(src, dst, places, targets) -> None:
    """Every block of ``places`` in ``src`` is byte for byte its target's in ``dst``."""
    for layer in range(len(src)):
        for p, t in zip(places, targets, strict=True):
            for a, b in zip(p.ids_by_layer[layer], t.ids_by_layer[layer], strict=True):
                assert torch.equal(_bytes(src[layer], a), _bytes(dst[layer], b))


@gpu
@pytest.mark.parametrize("layout", sorted(LAYOUT_ORDERS))
@pytest.mark.parametrize("layerwise", [False, True])
def test_blocks_round_trip_on_the_gpu_through_a_ring_smaller_than_the_load(layout, layerwise):
    from kvtier.engines.transfer import open_transfer_engine

    _, src = paged_kv(SHAPE, layout, "cuda", seed=1)
    _, dst = paged_kv(SHAPE, layout, "cuda", seed=2)
    chunk = PagedKV.of(src, 16).chunk_bytes(2)
    out = open_transfer_engine(src, 16, 32, ring_bytes=2 * chunk)  # two slots, five chunks
    into = open_transfer_engine(dst, 16, 32, ring_bytes=2 * chunk)
    places = [Placement.same([1 + 2 * c, 2 + 2 * c], 4) for c in range(5)]
    targets = [Placement.same([31 - 2 * c, 32 - 2 * c], 4) for c in range(5)]
    host = [bytearray(chunk) for _ in places]  # pageable buffers go through the ring too
    out.to_host(places, host)
    progress = LoadProgress(4)
    into.to_device(targets, host, progress, layerwise=layerwise)
    progress.wait()
    torch.cuda.synchronize()
    _assert_moved(src, dst, places, targets)
    untouched = _bytes(dst[0], 12)
    assert torch.equal(untouched, _bytes(paged_kv(SHAPE, layout, "cuda", seed=2)[1][0], 12))


@gpu
def test_each_layer_is_usable_once_waited_for_and_not_written_into_the_null_block():
    from kvtier.engines.transfer import open_transfer_engine

    _, src = paged_kv(SHAPE, "LBNHC", "cuda", seed=3)
    _, dst = paged_kv(SHAPE, "LBNHC", "cuda", seed=4)
    before = _bytes(dst[1], 0).clone()
    out = open_transfer_engine(src, 16, 32)
    into = open_transfer_engine(dst, 16, 32)
    bufs = out.take_buffers(1)
    out.to_host([Placement.same([5, 6], 4)], bufs)
    progress = LoadProgress(4)
    into.to_device([Placement(((7, 8), (0, 9), (10, 11), (12, 13)))], bufs, progress, True)
    for layer, (a, b) in enumerate([(7, 5), (9, 6), (10, 5), (13, 6)]):
        assert progress.wait_layer(layer, timeout=10)
        same = torch.equal(_bytes(dst[layer], a), _bytes(src[layer], b))  # on the compute stream
        assert same
    assert torch.equal(_bytes(dst[1], 0), before)
    out.give_buffers(bufs)


@gpu
@pytest.mark.parametrize("layout", ["LBNHC", "BHLNC"])
def test_chunks_already_on_the_gpu_are_scattered_beside_host_ones(layout):
    """What a read straight into GPU memory (GPUDirect Storage) hands the engine."""
    from kvtier.engines.transfer import open_transfer_engine

    _, src = paged_kv(SHAPE, layout, "cuda", seed=3)
    _, dst = paged_kv(SHAPE, layout, "cuda", seed=4)
    chunk = PagedKV.of(src, 16).chunk_bytes(2)
    out = open_transfer_engine(src, 16, 32, ring_bytes=4 * chunk)
    into = open_transfer_engine(dst, 16, 32, ring_bytes=4 * chunk)
    places = [Placement.same([1 + 2 * c, 2 + 2 * c], 4) for c in range(4)]
    targets = [Placement.same([31 - 2 * c, 32 - 2 * c], 4) for c in range(4)]
    host = [bytearray(chunk) for _ in places]
    out.to_host(places, host)
    mixed = [
        torch.frombuffer(h, dtype=torch.uint8).to("cuda") if c % 2 == 0 else h
        for c, h in enumerate(host)
    ]
    progress = LoadProgress(4)
    into.to_device(targets, mixed, progress, layerwise=True)
    progress.wait()
    torch.cuda.synchronize()
    _assert_moved(src, dst, places, targets)
