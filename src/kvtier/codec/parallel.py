"""A batch's blocks decoded on every core: each tier's pool of decode threads.

The kv codec's C part and zstd release the GIL while they work, so blocks handed to threads
decode on all cores at once, and the thread that drives a tier's I/O (an io_uring ring, a
Redis pipeline) goes on reaping and submitting meanwhile. The pool starts on first use, one
thread per core; on one core everything runs inline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


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
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="kvtier-decode")
            return self._pool

    def close(self) -> None:
        """Stop the threads (after the work handed over); later work runs inline."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["Decoders"]
