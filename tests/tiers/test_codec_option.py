"""``codec=`` on every tier: blocks are stored coded at their coded size, counted so against the
capacity, the header records the codec used, and the same bytes come back."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kvtier.codec import BlockMeta
from kvtier.errors import ConfigError
from kvtier.specs.units import MiB
from kvtier.tiers.files.slab import coded_size_class
from kvtier.tiers.registry import open_tier

NS = bytes(range(16))
SHAPE = (4, 2, 3, 256, 64)  # layers, k/v, kv heads, tokens, head dim: 768 KiB of bf16


def _kv_block(seed: int) -> np.ndarray:
    """A bf16 KV-like block (per-channel scales), as bytes."""
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-6, 3, size=(*SHAPE[:-2], 1, SHAPE[-1])))
    x = (rng.standard_normal(SHAPE, dtype=np.float32) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).ravel()


def _key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def _urls(tmp_path: Path, size: str, codec: str | None) -> dict[str, str]:
    q = f"&codec={codec}" if codec else ""
    return {
        "memory": f"memory://?size={size}&pin=0{q}",
        "file": f"file://{tmp_path}/file?size={size}{q}",
        "slab": f"slab://{tmp_path}/slab?size={size}{q}",
    }


@pytest.mark.parametrize("kind", ["memory", "file", "slab"])
def test_coded_blocks_are_stored_smaller_and_come_back_exact(tmp_path: Path, kind: str):
    tier = open_tier(_urls(tmp_path, "64MiB", "kv")[kind], NS)
    try:
        meta = BlockMeta("bf16", SHAPE)
        blocks = [_kv_block(i) for i in range(6)]
        noise = np.random.default_rng(9).integers(0, 256, blocks[0].size, dtype=np.uint8)
        assert all(tier.put(_key(i), b, meta) for i, b in enumerate(blocks))
        assert tier.put(_key(99), noise, meta)
        used = tier.usage().used_bytes
        assert used < 0.85 * (sum(b.size for b in blocks) + noise.size)
        for i, b in enumerate(blocks):
            out = np.zeros(b.size, np.uint8)
            header = tier.get_into(_key(i), out)
            assert header.meta.codec == "kv" and header.stored_len < 0.8 * b.size
            assert np.array_equal(out, b)
        out = np.zeros(noise.size, np.uint8)
        assert tier.get_into(_key(99), out).meta.codec == "raw"  # it did not gain
        assert np.array_equal(out, noise)
    finally:
        tier.close()


@pytest.mark.parametrize("kind", ["memory", "slab"])
def test_the_same_capacity_holds_more_coded_blocks(tmp_path: Path, kind: str):
    held = {}
    for codec in ("raw", "kv"):
        tier = open_tier(_urls(tmp_path / codec, "8MiB", codec)[kind], NS)
        try:
            meta = BlockMeta("bf16", SHAPE)
            for i in range(24):
                tier.put(_key(i), _kv_block(i), meta)
            held[codec] = tier.usage().blocks
        finally:
            tier.close()
    assert held["kv"] >= 1.25 * held["raw"]


def test_defaults_are_off_for_dram_and_on_for_disk(tmp_path: Path):
    urls = _urls(tmp_path, "16MiB", None)
    expected = {"memory": "raw", "file": "kv", "slab": "kv"}
    for kind, url in urls.items():
        tier = open_tier(url, NS)
        try:
            assert tier.codec == expected[kind]
        finally:
            tier.close()


def test_an_unknown_codec_is_refused_when_the_url_is_read(tmp_path: Path):
    with pytest.raises(ConfigError, match="codec"):
        open_tier(f"file://{tmp_path}?size=1MiB&codec=lz4", NS)


def test_a_block_stored_coded_is_stored_by_the_receiving_tiers_codec(tmp_path: Path):
    """A block read from a kv tier and put into a raw tier is stored raw there."""
    disk = open_tier(_urls(tmp_path, "16MiB", "kv")["file"], NS)
    mem = open_tier(_urls(tmp_path, "16MiB", "raw")["memory"], NS)
    try:
        block = _kv_block(3)
        disk.put(_key(1), block, BlockMeta("bf16", SHAPE))
        out = np.zeros(block.size, np.uint8)
        header = disk.get_into(_key(1), out)
        assert header.meta.codec == "kv"
        mem.put(_key(1), out, header.meta)
        assert mem.get_into(_key(1), np.zeros(block.size, np.uint8)).meta.codec == "raw"
    finally:
        disk.close()
        mem.close()


def test_slab_size_classes_round_up_by_less_than_a_64th():
    page = 4096
    sizes = [page * n for n in (1, 2, 63, 64, 65, 127, 128, 129, 700, 1000, 1025, 5000)]
    for size in sizes:
        c = coded_size_class(size)
        assert size <= c < size * (1 + 1 / 64) + page and c % page == 0
    assert len({coded_size_class(page * n) for n in range(900, 1100)}) <= 26
    assert MiB % page == 0


@pytest.mark.parametrize("kind", ["file", "slab"])
def test_a_batch_of_coded_blocks_decodes_on_the_decode_threads(tmp_path: Path, kind: str):
    """On io_uring the ring's thread hands each coded block's check and decode to the decode
    threads (every core) and goes on with the I/O; the batch comes back exact."""
    from kvtier.tiers.io.backends import uring_available

    if not uring_available():
        pytest.skip("io_uring is not available here")
    tier = open_tier(_urls(tmp_path, "64MiB", "kv")[kind] + "&io=uring", NS)
    try:
        assert tier.io.completes_inline and tier._decoders.parallel == ((os.cpu_count() or 1) > 1)
        meta = BlockMeta("bf16", SHAPE)
        blocks = [_kv_block(i) for i in range(8)]
        assert all(tier.put_many([(_key(i), b, meta) for i, b in enumerate(blocks)]))
        outs = [np.zeros(b.size, np.uint8) for b in blocks]
        got = tier.get_many_into([_key(i) for i in range(8)] + [_key(50)], [*outs, outs[0]])
        assert [g.meta.codec for g in got[:8]] == ["kv"] * 8 and got[8] is None
        assert all(np.array_equal(o, b) for o, b in zip(outs, blocks, strict=True))
    finally:
        tier.close()


def test_a_batch_of_coded_reads_keeps_few_reads_ahead_of_the_decoders(tmp_path: Path):
    """With io_uring and several cores a coded read batch asks the backend for at most the
    decode threads + READS_AHEAD reads in flight, whatever the tier's depth; a batch of blocks
    stored raw (noise in a coded tier), and every write batch, keep the tier's depth."""
    from kvtier.tiers.files.base import READS_AHEAD
    from kvtier.tiers.io.backends import uring_available

    if not uring_available() or (os.cpu_count() or 1) < 2:
        pytest.skip("needs io_uring and two cores")
    tier = open_tier(_urls(tmp_path, "64MiB", "kv")["slab"] + "&io=uring&depth=16", NS)
    asked: list[tuple[int, int | None]] = []
    run = tier.io.run

    def spy(count, prepare, complete, depth=None):
        asked.append((count, depth))
        return run(count, prepare, complete, depth)

    tier.io.run = spy
    try:
        meta = BlockMeta("bf16", SHAPE)
        blocks = [_kv_block(i) for i in range(6)]
        noise = np.random.default_rng(3).integers(0, 256, (3, blocks[0].size), dtype=np.uint8)
        assert all(tier.put_many([(_key(i), b, meta) for i, b in enumerate(blocks)]))
        assert all(tier.put_many([(_key(10 + i), b, meta) for i, b in enumerate(noise)]))
        assert {d for _, d in asked} == {None}  # writes: the tier's depth
        asked.clear()
        outs = [np.zeros(blocks[0].size, np.uint8) for _ in range(6)]
        got = tier.get_many_into([_key(i) for i in range(6)], outs)
        assert [g.meta.codec for g in got] == ["kv"] * 6
        assert all(np.array_equal(o, b) for o, b in zip(outs, blocks, strict=True))
        assert asked == [(6, tier._decoders.threads + READS_AHEAD)]
        asked.clear()
        got = tier.get_many_into([_key(10 + i) for i in range(3)], outs[:3])
        assert [g.meta.codec for g in got] == ["raw"] * 3
        assert all(np.array_equal(o, b) for o, b in zip(outs, noise, strict=False))
        assert asked == [(3, None)]
    finally:
        tier.close()


@pytest.mark.parametrize("kind", ["file", "slab"])
def test_a_batch_of_coded_writes_encodes_ahead_and_every_block_comes_back(
    tmp_path: Path, kind: str
):
    """put_many encodes a batch's blocks on the codec threads ahead of its I/O: each block is
    stored with its own coded form (noise stays raw), none is lost or swapped."""
    tier = open_tier(_urls(tmp_path, "64MiB", "kv")[kind], NS)
    try:
        meta = BlockMeta("bf16", SHAPE)
        rng = np.random.default_rng(5)
        blocks = [
            _kv_block(i) if i % 4 else rng.integers(0, 256, _kv_block(0).size, dtype=np.uint8)
            for i in range(12)
        ]
        assert tier.put_many([(_key(i), b, meta) for i, b in enumerate(blocks)]) == [True] * 12
        outs = [np.zeros(b.size, np.uint8) for b in blocks]
        headers = tier.get_many_into([_key(i) for i in range(12)], outs)
        for i, (b, out, h) in enumerate(zip(blocks, outs, headers, strict=True)):
            assert h.meta.codec == ("kv" if i % 4 else "raw")
            assert np.array_equal(out, b)
    finally:
        tier.close()
