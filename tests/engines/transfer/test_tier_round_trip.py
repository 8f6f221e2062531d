"""Blocks of every vLLM layout through kvtier's memory, file and slab tiers and back, exact."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvtier.codec import BlockMeta  # noqa: E402
from kvtier.engines.transfer import Placement, open_transfer_engine  # noqa: E402
from kvtier.tiers.registry import open_tier  # noqa: E402

NS = bytes(range(16))
BLOCK = 16


def urls(tmp_path: Path) -> dict[str, str]:
    return {
        "memory": "memory://?size=16MiB&pin=0",
        "memory-kv": "memory://?size=16MiB&pin=0&codec=kv",
        "file": f"file://{tmp_path}/file?size=16MiB",
        "slab": f"slab://{tmp_path}/slab?size=16MiB",
        "slab-kv": f"slab://{tmp_path}/slabkv?size=16MiB&codec=kv",
    }


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC", "BHLNC", "LHBNC"])
@pytest.mark.parametrize("tier", ["memory", "memory-kv", "file", "slab", "slab-kv"])
def test_chunks_go_through_a_tier_and_land_in_other_blocks_bit_for_bit(
    tmp_path, caches_of, layout, tier
):
    src, dst = caches_of(layout, blocks=12, seed=7), caches_of(layout, blocks=12, seed=8)
    out = open_transfer_engine(src, BLOCK, 2 * BLOCK)
    into = open_transfer_engine(dst, BLOCK, 2 * BLOCK)
    store = open_tier(urls(tmp_path)[tier], NS)
    try:
        bufs = out.take_buffers(3)
        out.to_host([Placement.same(p, 3) for p in ([1, 2], [3, 4], [5, 6])], bufs)
        meta = BlockMeta(dtype="bf16")
        for i, buf in enumerate(bufs):
            assert store.put(bytes([i]) * 16, buf, meta)
        back = into.take_buffers(3)
        for i, buf in enumerate(back):
            buf[:] = 0
            assert store.get_into(bytes([i]) * 16, buf) is not None
        into.to_device([Placement.same(p, 3) for p in ([7, 8], [9, 10], [11, 1])], back)
        pairs = {7: 1, 8: 2, 9: 3, 10: 4, 11: 5, 1: 6}
        for layer in range(3):
            for d, s in pairs.items():
                assert torch.equal(dst[layer][d].view(torch.uint8), src[layer][s].view(torch.uint8))
    finally:
        store.close()
