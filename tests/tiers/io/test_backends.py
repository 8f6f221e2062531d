"""Aligned buffers, the raw io_uring ring, the I/O backends, the slab arena, recycled files."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.tiers.files.freefiles import FreeFiles, sole_opener
from kvtier.tiers.io import uring as _uring
from kvtier.tiers.io.backends import BACKENDS, IOOp, make_backend, run_inline, uring_available
from kvtier.tiers.io.buffers import PAGE, BufferPool, address, aligned_array, is_aligned
from kvtier.tiers.memory.arena import SlabArena

URING = pytest.mark.skipif(not uring_available(), reason="io_uring is not available here")


def test_aligned_array_is_page_aligned_and_sized():
    for n in (1, 4096, 5000, 5 << 20):
        a = aligned_array(n)
        assert a.nbytes == n and address(a) % PAGE == 0 and is_aligned(a)
        a[:] = 7  # writable
    assert not is_aligned(np.empty(PAGE + 1, np.uint8)[1:])


def test_buffer_pool_reuses_buffers():
    pool = BufferPool(keep=2)
    a = pool.take(5000)
    assert a.nbytes >= 5000 and is_aligned(a)
    pool.give(a)
    b = pool.take(3000)  # the free one fits: same memory
    assert address(b) == address(a)
    c = pool.take(3000)  # none free: a new one
    assert address(c) != address(b)
    for buf in (b, c, pool.take(1 << 21)):
        pool.give(buf)
    assert len(pool._free) == 2  # keeps at most ``keep``


def _file(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    return str(path)


def test_run_inline_reads_and_writes_vectors(tmp_path: Path):
    data = os.urandom(3 * PAGE)
    path = _file(tmp_path, data)
    fd = os.open(path, os.O_RDWR)
    try:
        bufs = [bytearray(100), bytearray(PAGE), bytearray(3 * PAGE)]
        assert run_inline(IOOp(fd, bufs, 0)) == 3 * PAGE  # short at end of file
        assert bytes(bufs[0]) + bytes(bufs[1]) == data[: 100 + PAGE]
        assert run_inline(IOOp(fd, [b"abc", b"def"], 10, write=True)) == 6
        assert os.pread(fd, 6, 10) == b"abcdef"
    finally:
        os.close(fd)
    assert run_inline(IOOp(-1, [bytearray(10)])) < 0  # an error comes back as -errno


@pytest.mark.parametrize("name", ["threads", pytest.param("uring", marks=URING)])
def test_backends_run_many_ops_with_bounded_depth(tmp_path: Path, name: str):
    data = os.urandom(64 * PAGE)
    path = _file(tmp_path, data)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    backend = make_backend(name, 4)
    try:
        outs = [aligned_array(PAGE) for _ in range(64)]
        results: dict[int, int] = {}
        lock = threading.Lock()

        def prepare(i):
            return None if i % 7 == 3 else IOOp(fd, [outs[i]], i * PAGE)

        def complete(i, res):
            with lock:
                results[i] = res

        backend.run(64, prepare, complete)
        assert results == {i: PAGE for i in range(64) if i % 7 != 3}
        for i in results:
            assert outs[i].tobytes() == data[i * PAGE : (i + 1) * PAGE]
        backend.run(0, prepare, complete)
    finally:
        backend.close()
        os.close(fd)


@pytest.mark.parametrize("name", ["threads", pytest.param("uring", marks=URING)])
def test_a_batch_can_ask_for_fewer_ops_in_flight(tmp_path: Path, name: str):
    data = os.urandom(32 * PAGE)
    fd = os.open(_file(tmp_path, data), os.O_RDONLY | os.O_DIRECT)
    backend = make_backend(name, 8)
    try:
        assert backend.limit(None) == 8 and backend.limit(2) == 2 and backend.limit(99) == 8
        assert backend.limit(0) == 1
        outs = [aligned_array(PAGE) for _ in range(32)]
        lock = threading.Lock()
        open_ops = [0, 0]  # prepared and not yet completed; the most seen

        def prepare(i):
            with lock:
                open_ops[0] += 1
                open_ops[1] = max(open_ops)
            return IOOp(fd, [outs[i]], i * PAGE)

        def complete(i, res):
            assert res == PAGE
            with lock:
                open_ops[0] -= 1

        backend.run(32, prepare, complete, 2)
        # io_uring prepares the next op while the ring is full, so one more may be open
        assert open_ops == [0, open_ops[1]] and open_ops[1] <= (3 if name == "uring" else 2)
        assert all(outs[i].tobytes() == data[i * PAGE : (i + 1) * PAGE] for i in range(32))
    finally:
        backend.close()
        os.close(fd)


def test_unknown_backend():
    with pytest.raises(ConfigError):
        make_backend("aio", 4)
    with pytest.raises(ConfigError):
        make_backend("threads", 0)
    assert set(BACKENDS) == {"threads", "uring"}


@URING
def test_uring_ring_reads_and_writes(tmp_path: Path):
    path = _file(tmp_path, bytes(4 * PAGE))
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    ring = _uring.Ring(4)
    try:
        src = aligned_array(2 * PAGE)
        src[:] = np.arange(2 * PAGE, dtype=np.uint8)
        iov = _uring.iovec_array([(address(src), src.nbytes)])
        ring.queue(_uring.OP_WRITEV, fd, ctypes.addressof(iov), 1, PAGE, 11)
        assert ring.wait(1) == [(11, 2 * PAGE)]
        dst = aligned_array(2 * PAGE)
        iov2 = _uring.iovec_array([(address(dst), dst.nbytes)])
        ring.queue(_uring.OP_READV, fd, ctypes.addressof(iov2), 1, PAGE, 12)
        ring.queue(_uring.OP_READV, -1, ctypes.addressof(iov2), 1, 0, 13)  # bad fd
        got = dict(ring.wait(2))
        assert got[12] == 2 * PAGE and got[13] < 0
        assert np.array_equal(dst, src)
        for i in range(4):
            ring.queue(_uring.OP_NOP, -1, 0, 0, 0, i)
        with pytest.raises(_uring.UringError):
            ring.queue(_uring.OP_NOP, -1, 0, 0, 0, 99)  # full
        assert sorted(ring.wait(4)) == [(i, 0) for i in range(4)]
    finally:
        ring.close()
        os.close(fd)


def test_slab_arena_hands_out_and_reuses_slots():
    arena = SlabArena(10 * 4096, 4096)
    assert arena.slots == 10 and arena.free_slots == 10 and arena.mapped_bytes == 0
    a = arena.alloc(3)
    assert list(a) == [0, 1, 2] and arena.held_slots == 3
    arena.view(a[0])[:] = 1
    assert arena.alloc(8) is None and arena.held_slots == 3  # nothing taken on failure
    arena.free(a)
    assert list(arena.alloc(3)) == [0, 1, 2]  # freed slots come back first
    assert arena.mapped_bytes <= 10 * 4096


def _block_file(path: Path, pages: int) -> str:
    path.write_bytes(bytes(pages * PAGE))
    return str(path)


def test_free_files_pool(tmp_path: Path):
    parent = str(tmp_path / "free")
    free = FreeFiles(parent)
    free.add(_block_file(tmp_path / "b.kvb", 2))
    assert not (tmp_path / "b.kvb").exists() and free.bytes == 2 * PAGE
    assert free.take(PAGE) is None
    path = free.take(2 * PAGE)
    assert path and os.path.getsize(path) == 2 * PAGE and free.bytes == 0
    os.unlink(path)  # the taker renames it away
    odd = tmp_path / "odd"
    odd.write_bytes(b"x" * 10)
    free.add(str(odd))  # not whole pages: dropped
    free.add(str(tmp_path / "missing"))
    assert free.bytes == 0
    free.add(_block_file(tmp_path / "c.kvb", 3))
    free.drop_one()
    assert free.bytes == 0 and not os.listdir(free.directory)


def test_free_files_are_handed_over_only_when_abandoned(tmp_path: Path):
    parent = tmp_path / "free"
    closed, alive = FreeFiles(str(parent)), FreeFiles(str(parent))
    closed.add(_block_file(tmp_path / "a.kvb", 1))
    alive.add(_block_file(tmp_path / "b.kvb", 2))
    closed.release()
    dead = parent / "999999999.cafe"  # a process that no longer exists
    dead.mkdir()
    _block_file(dead / "x.free", 4)
    (parent / "stray").write_bytes(b"?")
    heir = FreeFiles(str(parent))
    heir.scan()
    assert heir.bytes == (1 + 4) * PAGE  # the closed instance's and the dead one's
    assert alive.bytes == 2 * PAGE and os.listdir(alive.directory)  # a live one keeps its own
    assert not (parent / "stray").exists() and not dead.exists()
    assert heir.take(2 * PAGE) is None and heir.take(4 * PAGE) is not None


def test_sole_opener_sees_other_openers(tmp_path: Path):
    path = _file(tmp_path, bytes(PAGE))
    fd = os.open(path, os.O_WRONLY)
    try:
        assert sole_opener(fd) is True
        other = os.open(path, os.O_RDONLY)
        assert sole_opener(fd) is False
        os.close(other)
        assert sole_opener(fd) is True
    finally:
        os.close(fd)
