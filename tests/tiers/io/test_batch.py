"""The disk tier's short io_uring path: batched reads and writes do what the general path does."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kvtier.codec import (
    BlockHeader,
    BlockMeta,
    CorruptBlockError,
    ForeignBlockError,
    pack_block,
    parse_header,
)
from kvtier.testing.tier_conformance import NS_A, check_payload, make_key, make_payload
from kvtier.tiers.files.per_block import DiskTier
from kvtier.tiers.io import uring as _uring
from kvtier.tiers.io.backends import uring_available
from kvtier.tiers.io.batch import RawHeaders, Slots, WriteOp, buffer_address, write_blocks
from kvtier.tiers.io.buffers import PAGE, aligned_array

pytestmark = pytest.mark.skipif(not uring_available(), reason="io_uring is not available here")
SIZES = (3 * PAGE, 5000, 2 * PAGE + 1)  # whole pages, a tail, one byte past a page


def _aligned_payload(key: bytes, version: int, n: int) -> np.ndarray:
    buf = aligned_array(n)
    buf[:] = make_payload(key, version, n)
    return buf


@pytest.mark.parametrize("depth", [1, 3])
def test_batched_round_trip_with_tails(tmp_path: Path, depth: int):
    with DiskTier(NS_A, tmp_path, 1 << 20, io="uring", depth=depth) as tier:
        keys = [make_key(i) for i in range(7)]
        sizes = [SIZES[i % len(SIZES)] for i in range(7)]
        payloads = [_aligned_payload(k, 1, n) for k, n in zip(keys, sizes, strict=True)]
        assert all(
            tier.put_many([(k, p, BlockMeta()) for k, p in zip(keys, payloads, strict=True)])
        )
        for k, n in zip(keys, sizes, strict=True):  # whole files, page padded, zero padding
            data = Path(tier.block_path(k)).read_bytes()
            assert len(data) == PAGE + -(-n // PAGE) * PAGE
            assert not any(data[PAGE + n :])
        outs = [aligned_array(n + PAGE) for n in sizes]
        for out in outs:
            out[:] = 0xAB
        for _ in range(2):  # the second time from the headers the tier now holds
            results = tier.get_many_into(keys, outs)
            for k, n, out, res in zip(keys, sizes, outs, results, strict=True):
                assert isinstance(res, BlockHeader) and res.raw_len == n
                assert check_payload(out, n, k) == 1
                assert (out[n:] == 0xAB).all(), "bytes past the block were written"


def test_unaligned_and_odd_buffers_are_served(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, 1 << 20, io="uring", depth=4) as tier:
        keys = [make_key(i) for i in range(4)]
        n = 3 * PAGE
        assert all(tier.put_many([(k, _aligned_payload(k, 2, n), BlockMeta()) for k in keys]))
        outs = [
            np.zeros(n + 1, np.uint8)[1:],  # unaligned
            bytearray(n),
            np.zeros((3, PAGE), np.uint8),
            aligned_array(n),
        ]
        for k, out, res in zip(keys, outs, tier.get_many_into(keys, outs), strict=True):
            assert isinstance(res, BlockHeader)
            assert check_payload(out, n, k) == 2


def test_unaligned_payloads_are_written(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, 1 << 20, io="uring", depth=2) as tier:
        keys = [make_key(i) for i in range(3)]
        payloads = [
            np.concatenate([np.zeros(1, np.uint8), make_payload(k, 3, 9000)])[1:] for k in keys
        ]
        payloads.append(make_payload(make_key(9), 3, 100).tobytes())  # read-only bytes
        keys.append(make_key(9))
        assert all(
            tier.put_many([(k, p, BlockMeta()) for k, p in zip(keys, payloads, strict=True)])
        )
        for k, p in zip(keys, payloads, strict=True):
            out = np.zeros(len(p), np.uint8)
            assert tier.get_into(k, out) is not None
            assert check_payload(out, len(p), k) == 3


def test_damage_and_replacement_under_a_batched_reader(tmp_path: Path):
    with (
        DiskTier(NS_A, tmp_path, 1 << 20, io="uring", depth=4) as tier,
        DiskTier(NS_A, tmp_path, 1 << 20, io="uring", depth=4) as other,
    ):
        keys = [make_key(i) for i in range(5)]
        n = 2 * PAGE
        assert all(tier.put_many([(k, _aligned_payload(k, 1, n), BlockMeta()) for k in keys]))
        outs = [aligned_array(4 * PAGE) for _ in keys]
        tier.get_many_into(keys, outs)
        # key 0: payload bit flip; key 1: another writer's larger version; key 2: gone;
        # key 3: another key's file moved over it; key 4 untouched
        with open(tier.block_path(keys[0]), "r+b") as f:
            f.seek(PAGE + 100)
            byte = f.read(1)[0]
            f.seek(PAGE + 100)
            f.write(bytes([byte ^ 4]))
        assert other.put(keys[1], _aligned_payload(keys[1], 7, 3 * PAGE))
        os.unlink(tier.block_path(keys[2]))
        assert other.put(make_key(50), _aligned_payload(make_key(50), 1, n))
        os.replace(other.block_path(make_key(50)), tier.block_path(keys[3]))
        results = tier.get_many_into(keys, outs)
        assert isinstance(results[0], CorruptBlockError)
        assert isinstance(results[1], BlockHeader) and results[1].raw_len == 3 * PAGE
        assert check_payload(outs[1], 3 * PAGE, keys[1]) == 7
        assert results[2] is None and not tier.contains(keys[2])
        assert isinstance(results[3], ForeignBlockError)
        assert isinstance(results[4], BlockHeader)
        assert check_payload(outs[4], n, keys[4]) == 1


def test_buffer_address():
    a = aligned_array(2 * PAGE)
    assert buffer_address(a, 2 * PAGE, writable=True) == a.ctypes.data
    assert buffer_address(a, 2 * PAGE + 1, writable=True) == 0  # too small
    assert buffer_address(a[1:], PAGE, writable=True) == 0  # unaligned
    assert buffer_address(a[::2], PAGE, writable=True) == 0  # not contiguous
    assert buffer_address(np.zeros(PAGE, np.uint16), 1, writable=True) == 0  # not bytes
    ro = a.copy()
    ro.flags.writeable = False
    assert buffer_address(ro, 0, writable=True) == 0
    assert buffer_address(memoryview(a), PAGE, writable=True) == a.ctypes.data


def test_a_failed_setup_leaves_the_ring_clean(tmp_path: Path):
    """An exception mid-batch drains the ring and still finishes every queued op."""
    ring = _uring.Ring(2)
    finished: list[tuple[int, int]] = []
    payload = aligned_array(PAGE)
    fds = [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(4)]

    def setup(i: int) -> WriteOp | None:
        if i == 3:
            raise RuntimeError("boom")
        return WriteOp(fds[i], b"h" * 128, memoryview(payload), payload.ctypes.data)

    try:
        with pytest.raises(RuntimeError, match="boom"):
            write_blocks(Slots(ring, 2), 4, setup, lambda i, res: finished.append((i, res)))
        assert ring.pending == 0
        assert sorted(i for i, _ in finished) == [0, 1, 2]
    finally:
        for fd in fds:
            os.close(fd)
        ring.close()


@pytest.mark.parametrize(
    "meta",
    [BlockMeta(), BlockMeta("u8", (5000,)), BlockMeta("bf16", (2, 3, 4), value=1.5)],
)
def test_raw_headers_match_pack_block(meta: BlockMeta):
    headers = RawHeaders(NS_A)
    for n in (1, PAGE, 5000):
        for i in range(3):
            key = make_key(i)
            payload = make_payload(key, i, n)
            want, _ = pack_block(NS_A, key, payload, meta)
            got, known = headers.pack(key, memoryview(payload), meta)
            assert got == want
            assert known.header == parse_header(want, NS_A, key)
            h = known.seed.copy()
            h.update(payload)
            assert h.intdigest() == known.header.checksum


def test_buffered_io_takes_the_same_path(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, 1 << 20, io="uring", depth=2, direct=False) as tier:
        keys = [make_key(i) for i in range(5)]
        sizes = [SIZES[i % len(SIZES)] for i in range(5)]
        payloads = [np.concatenate([np.zeros(3, np.uint8), make_payload(k, 4, n)])[3:]
                    for k, n in zip(keys, sizes, strict=True)]  # fmt: skip
        assert all(
            tier.put_many([(k, p, BlockMeta()) for k, p in zip(keys, payloads, strict=True)])
        )
        outs = [aligned_array(n) for n in sizes]
        for k, n, out, res in zip(keys, sizes, outs, tier.get_many_into(keys, outs), strict=True):
            assert isinstance(res, BlockHeader)
            assert check_payload(out, n, k) == 4
