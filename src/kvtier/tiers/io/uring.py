"""A minimal io_uring over the raw syscalls (ctypes): vectored reads and writes, nothing else.

Why not the ``liburing`` PyPI package: its wheel (2026.3.30) is built with AVX-512 and dies with
SIGILL inside ``Ring()`` on CPUs without it (seen on an AMD EPYC host), which a library cannot
catch. Two syscalls and three mmaps are all a batch of preadv/pwritev needs.

Only x86-64 is enabled: the ring protocol needs release/acquire ordering between the SQE stores
and the tail store, which x86's total store order gives plain stores; other architectures would
need explicit barriers that Python cannot emit. ``available()`` says whether a ring can be set
up here (kernels may disable io_uring by sysctl or seccomp); callers fall back to threads.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct
from collections.abc import Sequence

_SYS_SETUP = 425  # same number on every architecture (new-style syscall table)
_SYS_ENTER = 426
OP_NOP = 0
OP_READV = 1
OP_WRITEV = 2
_ENTER_GETEVENTS = 1
_FEAT_SINGLE_MMAP = 1
_OFF_SQ_RING = 0
_OFF_CQ_RING = 0x8000000
_OFF_SQES = 0x10000000

_SQE = struct.Struct("<BBHiQQIIQHHiQQ")  # 64 bytes: opcode .. user_data .. pad
_CQE = struct.Struct("<QiI")  # 16 bytes: user_data, res, flags


class _SQOffsets(ctypes.Structure):
    _fields_ = [
        *(
            (n, ctypes.c_uint32)
            for n in ("head", "tail", "mask", "entries", "flags", "dropped", "array", "resv1")
        ),
        ("user_addr", ctypes.c_uint64),
    ]


class _CQOffsets(ctypes.Structure):
    _fields_ = [
        *(
            (n, ctypes.c_uint32)
            for n in ("head", "tail", "mask", "entries", "overflow", "cqes", "flags", "resv1")
        ),
        ("user_addr", ctypes.c_uint64),
    ]


class _Params(ctypes.Structure):
    _fields_ = [
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32),
        ("sq_thread_idle", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        ("sq_off", _SQOffsets),
        ("cq_off", _CQOffsets),
    ]


class Iovec(ctypes.Structure):
    """``struct iovec``."""

    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class UringError(OSError):
    """io_uring cannot be used here (old kernel, disabled by sysctl/seccomp, other CPU)."""


class Ring:
    """One submission/completion ring pair of ``entries`` slots. Not thread-safe."""

    def __init__(self, entries: int = 8):
        if platform.machine() not in ("x86_64", "AMD64"):
            raise UringError(errno.ENOTSUP, "kvtier's io_uring path runs on x86-64 only")
        params = _Params()
        fd = _syscall(ctypes.c_long(_SYS_SETUP), ctypes.c_uint(entries), ctypes.byref(params))
        if fd < 0:
            err = ctypes.get_errno()
            raise UringError(err, f"io_uring_setup failed: {os.strerror(err)}")
        self.fd = fd
        self._maps: list[mmap.mmap] = []
        try:
            self._map(params)
        except BaseException:
            self.close()
            raise
        self.entries = params.sq_entries
        self.pending = 0  # submitted or queued, not yet reaped
        self._to_submit = 0
        self.short_slots = None  # the file tiers' scratch for batches on this ring (io.batch)

    def _mmap(self, size: int, offset: int) -> mmap.mmap:
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        m = mmap.mmap(
            self.fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset
        )
        self._maps.append(m)
        return m

    def _map(self, p: _Params) -> None:
        sq_size = p.sq_off.array + p.sq_entries * 4
        cq_size = p.cq_off.cqes + p.cq_entries * _CQE.size
        if p.features & _FEAT_SINGLE_MMAP:
            sq = cq = self._mmap(max(sq_size, cq_size), _OFF_SQ_RING)
        else:
            sq = self._mmap(sq_size, _OFF_SQ_RING)
            cq = self._mmap(cq_size, _OFF_CQ_RING)
        self._sqes = self._mmap(p.sq_entries * _SQE.size, _OFF_SQES)
        self._sq32 = memoryview(sq).cast("I")
        self._cq32 = memoryview(cq).cast("I")
        self._cq = cq
        self._sq_tail_i = p.sq_off.tail // 4
        self._sq_array_i = p.sq_off.array // 4
        self._sq_mask = self._sq32[p.sq_off.mask // 4]
        self._cq_head_i = p.cq_off.head // 4
        self._cq_tail_i = p.cq_off.tail // 4
        self._cq_mask = self._cq32[p.cq_off.mask // 4]
        self._cqes = p.cq_off.cqes
        self._tail = self._sq32[self._sq_tail_i]

    def queue(self, opcode: int, fd: int, iovecs, count: int, offset: int, user_data: int):
        """Queue one vectored op (``iovecs``: address of ``count`` iovecs); submitted on wait."""
        if self.pending >= self.entries:
            raise UringError(errno.EBUSY, "io_uring queue full; wait for completions first")
        idx = self._tail & self._sq_mask
        _SQE.pack_into(self._sqes, idx * _SQE.size, opcode, 0, 0, fd, offset, iovecs, count, 0,
                       user_data, 0, 0, 0, 0, 0)  # fmt: skip
        self._sq32[self._sq_array_i + idx] = idx
        self._tail = (self._tail + 1) & 0xFFFFFFFF
        self._sq32[self._sq_tail_i] = self._tail  # publish (x86 TSO: stores stay in order)
        self.pending += 1
        self._to_submit += 1

    def wait(self, min_complete: int = 1) -> list[tuple[int, int]]:
        """Submit what is queued, wait for ``min_complete`` completions, reap all that are ready.

        Returns (user_data, result) pairs; result is bytes moved or ``-errno``.
        """
        min_complete = min(min_complete, self.pending)
        done: list[tuple[int, int]] = []
        while True:
            done += self._reap()
            if len(done) >= min_complete and self._to_submit == 0:
                return done
            ret = self._enter(max(0, min_complete - len(done)), _ENTER_GETEVENTS)
            if ret >= 0:
                self._to_submit -= ret

    def submit(self) -> None:
        """Hand what is queued to the kernel now, without waiting for anything."""
        while self._to_submit:
            ret = self._enter(0, 0)
            if ret < 0:
                return  # busy: the next wait submits them
            self._to_submit -= ret

    def _enter(self, min_complete: int, flags: int) -> int:
        """``io_uring_enter`` submitting what is queued: ops taken, or -1 when the kernel was
        busy or interrupted (try again later); other errors raise."""
        ret = _syscall(
            ctypes.c_long(_SYS_ENTER),
            ctypes.c_int(self.fd),
            ctypes.c_uint(self._to_submit),
            ctypes.c_uint(min_complete),
            ctypes.c_uint(flags),
            None,
            ctypes.c_size_t(0),
        )
        if ret < 0:
            err = ctypes.get_errno()
            if err not in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                raise UringError(err, f"io_uring_enter failed: {os.strerror(err)}")
            return -1
        return ret

    def _reap(self) -> list[tuple[int, int]]:
        cq32 = self._cq32
        head = cq32[self._cq_head_i]
        tail = cq32[self._cq_tail_i]
        out = []
        while head != tail:
            user_data, res, _flags = _CQE.unpack_from(
                self._cq, self._cqes + (head & self._cq_mask) * _CQE.size
            )
            out.append((user_data, res))
            head = (head + 1) & 0xFFFFFFFF
        cq32[self._cq_head_i] = head
        self.pending -= len(out)
        return out

    def close(self) -> None:
        """Unmap the rings and close the ring's file descriptor."""
        self.short_slots = None
        for name in ("_sq32", "_cq32"):
            view = self.__dict__.pop(name, None)
            if view is not None:
                view.release()
        for m in self._maps:
            m.close()
        self._maps.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def iovec_array(addresses: Sequence[tuple[int, int]]) -> ctypes.Array:
    """A C array of iovecs from (address, length) pairs."""
    arr = (Iovec * len(addresses))()
    for i, (addr, n) in enumerate(addresses):
        arr[i].base = addr
        arr[i].len = n
    return arr


def available() -> bool:
    """Whether a ring can be set up and runs a no-op here."""
    try:
        ring = Ring(2)
    except OSError:
        return False
    try:
        ring.queue(OP_NOP, -1, 0, 0, 0, 7)
        return ring.wait(1) == [(7, 0)]
    except OSError:
        return False
    finally:
        ring.close()
