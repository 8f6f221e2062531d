"""The disk tier's device verbs (``gds=1``): payloads straight between files and tensors,
verified where they land. Here over POSIX reads and writes of CPU tensors; the GPU check runs
the same verbs through kvikio into CUDA memory."""

from __future__ import annotations

import os

import pytest
import torch

from kvtier.codec import BlockError, BlockMeta, BufferTooSmallError, CorruptBlockError
from kvtier.errors import ConfigError
from kvtier.testing.tier_conformance import NS_A, make_key
from kvtier.tiers import open_tier
from kvtier.tiers.files.device_io import PosixFileIO
from kvtier.tiers.files.per_block import DiskTier
from kvtier.tiers.io.buffers import PAGE, aligned_array

META = BlockMeta("bf16", (2, 3, 64))


def chunk(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    return torch.randn(2, 3, 64, generator=g).to(torch.bfloat16)


@pytest.fixture
def tier(tmp_path):
    t = DiskTier(NS_A, tmp_path, 1 << 20, device_io=PosixFileIO())
    yield t
    t.close()


def test_device_round_trip_is_bit_exact(tier) -> None:
    keys = [make_key(i) for i in range(5)]
    srcs = [chunk(i) for i in range(5)]
    assert tier.write_device([(k, s, META) for k, s in zip(keys, srcs, strict=True)]) == [True] * 5
    outs = [torch.empty_like(s) for s in srcs]
    headers = tier.read_device(keys, outs)
    for h, s, o in zip(headers, srcs, outs, strict=True):
        assert h is not None and not isinstance(h, Exception)
        assert h.digest is not None and h.meta.codec == "raw"
        assert torch.equal(o.view(torch.int16), s.view(torch.int16))


def test_host_path_reads_device_written_blocks(tier) -> None:
    keys = [make_key(i) for i in range(4)]
    srcs = [chunk(i) for i in range(4)]
    tier.write_device([(k, s, META) for k, s in zip(keys, srcs, strict=True)])
    outs = [aligned_array(srcs[0].numel() * 2) for _ in keys]
    headers = tier.get_many_into(keys, outs)  # the batch path, then one at a time
    assert all(h is not None and h.digest is not None for h in headers)
    for s, o in zip(srcs, outs, strict=True):
        assert bytes(o) == bytes(s.view(torch.uint8).numpy())
    single = aligned_array(srcs[0].numel() * 2)
    assert tier.get_into(keys[0], single) is not None
    assert bytes(single) == bytes(srcs[0].view(torch.uint8).numpy())


def test_host_path_stores_blocks_the_device_verbs_read(tier) -> None:
    keys = [make_key(i) for i in range(3)]
    srcs = [chunk(i) for i in range(3)]
    assert tier.put(keys[0], srcs[0].view(torch.uint8).numpy(), META)
    items = [(k, s.view(torch.uint8).numpy(), META) for k, s in zip(keys, srcs, strict=True)]
    assert tier.put_many(items[1:]) == [True, True]
    outs = [torch.empty_like(s) for s in srcs]
    headers = tier.read_device(keys, outs)
    assert all(h is not None and h.digest is not None for h in headers)
    for s, o in zip(srcs, outs, strict=True):
        assert torch.equal(o.view(torch.int16), s.view(torch.int16))
    assert tier.read_device([make_key(99)], [outs[0]]) == [None]  # a miss


def test_blocks_without_a_digest_are_left_to_the_host_path(tmp_path) -> None:
    plain = DiskTier(NS_A, tmp_path, 1 << 20)  # codec kv, no digest: what a gds=0 tier wrote
    keys = [make_key(1), make_key(2)]
    src = chunk(1)
    assert plain.put(keys[0], src.view(torch.uint8).numpy(), META)
    assert plain.put(keys[1], src.view(torch.uint8).numpy(), BlockMeta("bf16", codec="raw"))
    plain.close()
    device = DiskTier(NS_A, tmp_path, 1 << 20, device_io=PosixFileIO())
    try:
        out = torch.empty_like(src)
        assert device.read_device(keys, [out, out]) == [None, None]
        host = aligned_array(src.numel() * 2)
        assert device.get_into(keys[0], host) is not None  # still served, by the host path
        assert bytes(host) == bytes(src.view(torch.uint8).numpy())
    finally:
        device.close()


def test_damaged_payload_is_an_error_never_data(tier) -> None:
    key = make_key(2)
    src = chunk(2)
    tier.write_device([(key, src, META)])
    path = tier.block_path(key)
    with open(path, "r+b") as f:
        f.seek(PAGE + 77)
        byte = f.read(1)[0]
        f.seek(PAGE + 77)
        f.write(bytes([byte ^ 0x10]))
    out = torch.zeros_like(src)
    (result,) = tier.read_device([key], [out])
    assert isinstance(result, CorruptBlockError)
    (host,) = tier.get_many_into([key], [aligned_array(src.numel() * 2)])
    assert isinstance(host, CorruptBlockError)


def test_small_buffer_is_refused(tier) -> None:
    key = make_key(3)
    tier.write_device([(key, chunk(3), META)])
    with pytest.raises(BufferTooSmallError):  # the caller's mistake, as on the host path
        tier.read_device([key], [torch.empty(10, dtype=torch.bfloat16)])


def test_blocks_survive_a_reopen_and_evict_like_any(tmp_path) -> None:
    src = chunk(0)
    nbytes = src.numel() * src.element_size()
    per_file = PAGE + -(-nbytes // PAGE) * PAGE
    t = DiskTier(NS_A, tmp_path, 3 * per_file, device_io=PosixFileIO(), recycle=False)
    keys = [make_key(i) for i in range(5)]
    assert t.write_device([(k, chunk(i), META) for i, k in enumerate(keys)]) == [True] * 5
    assert t.contains_many(keys[:2]) == [False, False]  # the oldest left for room
    assert t.usage().used_bytes == 3 * per_file
    t.close()
    again = DiskTier(NS_A, tmp_path, 3 * per_file, device_io=PosixFileIO())
    try:
        out = torch.empty_like(src)
        (header,) = again.read_device([keys[4]], [out])
        assert header is not None and torch.equal(out.view(torch.int16), chunk(4).view(torch.int16))
    finally:
        again.close()


def test_device_verbs_need_gds(tmp_path) -> None:
    t = DiskTier(NS_A, tmp_path, 1 << 20)
    try:
        with pytest.raises(ConfigError, match="gds=1"):
            t.read_device([make_key(0)], [torch.empty(4)])
    finally:
        t.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_gds_is_refused_in_one_line_without_cuda(tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        open_tier(f"file://{tmp_path}?size=1MiB&gds=1", NS_A)
    assert "gds=1" in str(err.value) and "\n" not in str(err.value)
    assert not os.listdir(tmp_path)  # refused before it made anything


class FailingWrites(PosixFileIO):
    """Device writes that fail as a full device would (reads as POSIX)."""

    def write(self, path, src, nbytes, offset):
        raise OSError(28, "No space left on device")


def test_a_failed_device_write_stores_nothing_and_gives_its_room_back(tmp_path) -> None:
    t = DiskTier(NS_A, tmp_path, 1 << 20, device_io=FailingWrites())
    try:
        with pytest.warns(RuntimeWarning, match="filled up"):  # ENOSPC lowers the limit
            assert t.write_device([(make_key(1), chunk(1), META)]) == [False]
        assert t.usage().used_bytes == 0 and not t.contains(make_key(1))
        leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".tmp"]
        assert leftovers == []
    finally:
        t.close()


class BrokenDriver(PosixFileIO):
    """Device I/O that fails as kvikio does (a RuntimeError from its C++ layer)."""

    def read(self, path, out, nbytes, offset):
        raise RuntimeError("cuFile read failed")

    def write(self, path, src, nbytes, offset):
        raise RuntimeError("cuFile write failed")


def test_a_failing_driver_is_a_read_error_and_a_write_error(tmp_path) -> None:
    t = DiskTier(NS_A, tmp_path, 1 << 20, device_io=BrokenDriver())
    try:
        with pytest.raises(OSError, match="writing block"):  # as put_many's I/O errors do
            t.write_device([(make_key(1), chunk(1), META)])
        assert t.usage().used_bytes == 0 and not list(tmp_path.rglob("*.tmp"))
        assert t.put(make_key(2), chunk(2).view(torch.uint8).numpy(), META)  # the host path
        (result,) = t.read_device([make_key(2)], [torch.empty_like(chunk(2))])
        assert isinstance(result, BlockError)
    finally:
        t.close()


def test_a_strided_tensor_is_stored_as_its_values(tier) -> None:
    src = chunk(4).transpose(0, 2)  # not contiguous
    assert tier.write_device([(make_key(4), src, META)]) == [True]
    out = torch.empty(src.shape, dtype=src.dtype)
    assert tier.read_device([make_key(4)], [out])[0] is not None
    assert torch.equal(out.view(torch.int16), src.contiguous().view(torch.int16))
