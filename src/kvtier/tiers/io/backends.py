"""Parallel positional I/O for the disk tier: a thread pool of preadv/pwritev, or io_uring.

Both backends run the same steps per operation: ``prepare(i)`` opens a file and names its
buffers, the read or write runs with at most ``depth`` operations in flight, and
``complete(i, result)`` checks and publishes it. The thread pool runs all three steps in its
workers, so checksums, copies and system calls of different blocks overlap on several cores;
io_uring runs ``prepare``/``complete`` in the calling thread while the kernel does the I/O:
with the queue full it prepares the next operation before waiting, queues it the moment a
completion frees a slot, and only then completes the finished ones, so at any depth (1
included) the device is handed the next request without waiting for checksums, opens or
renames, and no thread hand-off sits between two requests. Callers make both callbacks
thread-safe.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

from kvtier.errors import ConfigError
from kvtier.tiers.io import uring as _uring
from kvtier.tiers.io.buffers import address


@dataclass(slots=True)
class IOOp:
    """One vectored read or write of ``bufs`` (in order) at ``offset`` of ``fd``."""

    fd: int
    bufs: Sequence
    offset: int = 0
    write: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes the operation moves when it completes fully."""
        return sum(memoryview(b).nbytes for b in self.bufs)


Prepare = Callable[[int], IOOp | None]
Complete = Callable[[int, int], None]


def run_inline(op: IOOp) -> int:
    """Perform one operation in the calling thread; bytes moved or ``-errno``.

    Short transfers are resumed until the end of file (reads) or an error.
    """
    bufs = [memoryview(b).cast("B") for b in op.bufs]
    done, offset = 0, op.offset
    call = os.pwritev if op.write else os.preadv
    while bufs:
        try:
            n = call(op.fd, bufs, offset)
        except InterruptedError:
            continue
        except OSError as exc:
            return -(exc.errno or 5)
        if n == 0:
            break
        done += n
        offset += n
        while bufs and n >= bufs[0].nbytes:
            n -= bufs[0].nbytes
            bufs.pop(0)
        if n:
            bufs[0] = bufs[0][n:]
    return done


class IOBackend(ABC):
    """Runs batches of positional I/O with at most ``depth`` operations in flight."""

    name: str
    ioengine: str  # fio's name for the same engine, for benchmarks that compare with fio
    #: Whether ``complete`` runs in the calling thread, between reaping one batch of finished
    #: ops and the next (so a caller with heavy completions hands them to other threads).
    completes_inline: ClassVar[bool] = False

    def __init__(self, depth: int):
        if depth < 1:
            raise ConfigError(f"disk I/O depth must be at least 1, got {depth}")
        self.depth = depth

    @abstractmethod
    def run(
        self, count: int, prepare: Prepare, complete: Complete, depth: int | None = None
    ) -> None:
        """Run ``count`` operations: ``prepare(i)`` returns the op (or None: nothing to do for
        ``i``), ``complete(i, result)`` gets bytes moved or ``-errno``. Neither may raise; both
        may be called from worker threads. ``depth``: at most this many in flight for this
        batch (never more than the backend's own depth)."""

    def limit(self, depth: int | None) -> int:
        """Operations a batch keeps in flight when it asks for at most ``depth``."""
        return self.depth if depth is None else max(1, min(self.depth, depth))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads or rings."""


class ThreadIO(IOBackend):
    """``depth`` threads, each preparing, doing (blocking ``os.preadv``/``os.pwritev``, GIL
    released) and completing whole operations.

    A batch starts ``min(depth, count)`` workers (the calling thread is one of them) that take
    the next operation from a shared counter until none is left: a task per worker, not per
    operation, so a large batch costs no thread hand-off per block.
    """

    name = "threads"
    ioengine = "psync"

    def __init__(self, depth: int):
        super().__init__(depth)
        self._pool = ThreadPoolExecutor(max(1, depth - 1), thread_name_prefix="kvtier-disk-io")

    def run(
        self, count: int, prepare: Prepare, complete: Complete, depth: int | None = None
    ) -> None:
        todo = iter(range(count))  # next() on it is atomic under the GIL: each i runs once

        def worker() -> None:
            for i in todo:
                op = prepare(i)
                if op is not None:
                    complete(i, run_inline(op))

        futures = [self._pool.submit(worker) for _ in range(min(self.limit(depth), count) - 1)]
        first: BaseException | None = None
        try:
            worker()
        except BaseException as exc:
            first = exc
        for fut in futures:  # waits for all, so no buffer is in use when this returns
            err = fut.exception()
            if first is None and err is not None:
                first = err
        if first is not None:
            raise first

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class UringIO(IOBackend):
    """io_uring rings (one per concurrent caller, reused) with ``depth`` entries each."""

    name = "uring"
    ioengine = "io_uring"
    completes_inline = True

    def __init__(self, depth: int):
        super().__init__(depth)
        self._free: list[_uring.Ring] = [_uring.Ring(depth)]  # fails early if unavailable
        self._lock = threading.Lock()
        self._closed = False

    def take_ring(self) -> _uring.Ring:
        """A ring of ``depth`` entries for the caller's own use; give it back after."""
        return self._take()

    def give_ring(self, ring: _uring.Ring) -> None:
        """Return a ring from :meth:`take_ring` (closed instead when it still has ops)."""
        self._give(ring)

    def _take(self) -> _uring.Ring:
        with self._lock:
            if self._free:
                return self._free.pop()
        return _uring.Ring(self.depth)

    def _give(self, ring: _uring.Ring) -> None:
        with self._lock:
            if not self._closed and ring.pending == 0:
                self._free.append(ring)
                return
        ring.close()

    def run(
        self, count: int, prepare: Prepare, complete: Complete, depth: int | None = None
    ) -> None:
        ring = self._take()
        limit = self.limit(depth)
        keep: dict[int, tuple] = {}  # user_data -> (iovec array, buffers): alive until reaped

        def queue(i: int, op: IOOp) -> None:
            views = [memoryview(b).cast("B") for b in op.bufs]
            iov = _uring.iovec_array([(address(v), v.nbytes) for v in views])
            keep[i] = (iov, views)
            opcode = _uring.OP_WRITEV if op.write else _uring.OP_READV
            ring.queue(opcode, op.fd, ctypes.addressof(iov), len(views), op.offset, i)

        i = 0
        try:
            while i < count or ring.pending:
                while i < count and ring.pending < limit:
                    op = prepare(i)
                    if op is not None:
                        queue(i, op)
                    i += 1
                if not ring.pending:
                    continue
                # the queue is full: prepare the next op while the device works, and queue it
                # the moment a slot frees, before completing the ops that just finished
                ahead = prepare(i) if i < count else None
                ahead_i = i
                i += i < count
                try:
                    done = ring.wait(1)
                except BaseException:
                    if ahead is not None:  # never queued: let it release what it holds
                        complete(ahead_i, -errno.ECANCELED)
                    raise
                for user_data, _ in done:
                    keep.pop(user_data, None)
                if ahead is not None:
                    queue(ahead_i, ahead)
                    ring.submit()
                for user_data, res in done:
                    complete(user_data, res)
        finally:
            while ring.pending:  # drain before the buffers can be reused
                for user_data, _ in ring.wait(ring.pending):
                    keep.pop(user_data, None)
            self._give(ring)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            rings, self._free = self._free, []
        for ring in rings:
            ring.close()


BACKENDS: dict[str, type[IOBackend]] = {"threads": ThreadIO, "uring": UringIO}


def uring_available() -> bool:
    """Whether the io_uring backend works on this machine."""
    return _uring.available()


def make_backend(name: str, depth: int) -> IOBackend:
    """An I/O backend by name: ``uring``, ``threads`` or ``auto`` (see DEFAULT_IO)."""
    if name == "auto":
        name = DEFAULT_IO if DEFAULT_IO != "uring" or uring_available() else "threads"
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown disk io backend {name!r}; use uring, threads or auto") from None
    try:
        return cls(depth)
    except OSError as exc:
        raise ConfigError(
            f"io={name} is not usable here ({exc}); use io=threads or io=auto"
        ) from None


# Chosen by measurement, see DiskTier's module docstring for the figures. ``auto`` falls back
# to threads where io_uring cannot be set up.
DEFAULT_IO = "uring"
