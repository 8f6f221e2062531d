"""A batch's blocks decoded and encoded on every core: each tier's pool of codec threads.

The kv codec's C part and zstd release the GIL while they work, so blocks handed to threads
decode on all cores at once, and the thread that drives a tier's I/O (an io_uring ring, a
Redis pipeline) goes on reaping and submitting meanwhile. Writes go the other way: a batch's
encodes start on the threads a few blocks ahead of the I/O (:class:`EncodeAhead`), so the
driving thread writes block ``i`` while later ones encode. The pool starts on first use, one
thread per core; on one core everything runs inline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: The names of the codec threads start so (a block coded on one of them has the thread alone:
#: its neighbours code the batch's other blocks).
DECODE_THREAD_PREFIX = "kvtier-decode"


def spare_core() -> bool:
    """Whether a block encoded or decoded on this thread may take a second core: the process
    may run on more than one and this is not one of a pool's codec threads (which share the
    cores out)."""
    if threading.current_thread().name.startswith(DECODE_THREAD_PREFIX):
        return False
    try:
        return len(os.sched_getaffinity(0)) > 1
    except AttributeError:  # pragma: no cover - platforms without sched_getaffinity
        return (os.cpu_count() or 1) > 1


class Decoders:
    """Threads a tier decodes (and checks) blocks on; ``threads`` defaults to the cores."""

    def __init__(self, threads: int | None = None):
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def parallel(self) -> bool:
        """Whether work handed over runs on other threads (more than one core, not closed)."""
        return self.threads > 1 and not self._closed

    def submit(self, fn: Callable[..., T], *args) -> Future[T]:
        """Run ``fn(*args)`` on a decode thread (inline once closed or on one core)."""
        pool = self._executor()
        if pool is not None:
            try:
                return pool.submit(fn, *args)
            except RuntimeError:  # closed meanwhile
                pass
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done

    def map(self, fn: Callable[..., T], items: Iterable[tuple]) -> list[T]:
        """``[fn(*item) for item in items]``, the items spread over the decode threads."""
        todo = list(items)
        if len(todo) < 2 or not self.parallel:
            return [fn(*item) for item in todo]
        futures = [self.submit(fn, *item) for item in todo]
        return [f.result() for f in futures]

    def _executor(self) -> ThreadPoolExecutor | None:
        if not self.parallel:
            return None
        with self._lock:
            if self._pool is None and not self._closed:
                self._pool = ThreadPoolExecutor(
                    self.threads, thread_name_prefix=DECODE_THREAD_PREFIX
                )
            return self._pool

    def close(self) -> None:
        """Stop the threads (after the work handed over); later work runs inline."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class EncodeAhead:
    """A batch's encodes run on a :class:`Decoders` pool, ``window`` items ahead of the caller.

    ``order`` is the item indices in the order the caller asks for them; ``encode(i)`` is what
    item ``i`` stores. :meth:`get` gives it (waiting for it, or running it inline where the
    pool is not parallel) and starts the encodes of the next ``window`` items, so at most
    ``window`` encoded items wait at once.
    """

    def __init__(
        self, pool: Decoders, order: Sequence[int], encode: Callable[[int], T], window: int
    ):
        self._pool, self._order, self._encode = pool, list(order), encode
        self._at = {i: k for k, i in enumerate(self._order)}
        self._window = max(1, window)
        self._started: dict[int, Future[T]] = {}
        self._next = 0
        self._lock = threading.Lock()

    def get(self, i: int) -> T:
        """Item ``i``'s encoded form (its encode's exception, re-raised). A batch of one item
        encodes inline: there is nothing to overlap, and the caller's thread may give the block
        a second core (see :func:`spare_core`)."""
        if not self._pool.parallel or i not in self._at or len(self._order) == 1:
            return self._encode(i)
        with self._lock:
            stop = min(len(self._order), self._at[i] + 1 + self._window)
            while self._next < stop:
                item = self._order[self._next]
                self._started[item] = self._pool.submit(self._encode, item)
                self._next += 1
            fut = self._started.pop(i, None)
        if fut is None:  # asked for twice
            return self._encode(i)
        return fut.result()

    def cancel(self) -> None:
        """Drop the encodes nobody asked for (the running ones finish unheld)."""
        with self._lock:
            for fut in self._started.values():
                fut.cancel()
            self._started.clear()


__all__ = ["Decoders", "EncodeAhead"]
