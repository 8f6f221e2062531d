"""Background writers: one bounded queue and one thread per tier.

``offer`` never blocks: what does not fit is refused and the caller counts it as dropped.
A slow tier therefore fills only its own queue; the faster tiers keep being written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from kvtier.codec import BlockMeta

log = logging.getLogger("kvtier.cache")

JobKind = Literal["store", "promote", "spill", "delete"]


class Hold:
    """A payload lent to writers: ``release(payload)`` runs once, when the last of the ``left``
    writers it was offered to has finished with it (or refused it)."""

    __slots__ = ("_lock", "left", "payload", "release")

    def __init__(self, payload: object, release: Callable[[object], None], left: int) -> None:
        self.payload = payload
        self.release = release
        self.left = left
        self._lock = threading.Lock()

    def drop(self) -> None:
        """One writer is done with the payload."""
        with self._lock:
            self.left -= 1
            last = self.left == 0
        if last:
            try:
                self.release(self.payload)
            except Exception:  # the lender's bug must not stop a writer
                log.exception("kvtier cache: releasing a stored payload failed")


@dataclass(frozen=True, slots=True)
class WriteJob:
    """One queued operation on a tier: put ``payload`` under ``key``, or delete ``key``;
    ``hold``: the lender's claim on the payload, dropped once the writer is done with it."""

    kind: JobKind
    key: bytes
    payload: object = None
    meta: BlockMeta | None = None
    hold: Hold | None = None


class TierWriter:
    """A bounded queue of WriteJobs drained in batches by one daemon thread."""

    def __init__(
        self,
        name: str,
        capacity: int,
        batch: int,
        handle: Callable[[list[WriteJob]], None],
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.batch = batch
        self._handle = handle
        self._queue: deque[WriteJob] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"kvtier-writer-{name}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting now."""
        return len(self._queue)

    def room(self) -> int:
        """Jobs that would fit now."""
        return max(0, self.capacity - len(self._queue))

    def offer(self, jobs: Sequence[WriteJob]) -> int:
        """Queue as many of ``jobs`` (in order) as fit; return how many. Never waits."""
        if not jobs:
            return 0
        with self._cond:
            if self._closed:
                return 0
            room = self.capacity - len(self._queue)
            taken = jobs if room >= len(jobs) else jobs[: max(room, 0)]
            if taken:
                self._queue.extend(taken)
                self._cond.notify()
            return len(taken)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the queue is empty and the thread idle; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, let the thread finish the queued ones, and join it."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    self._cond.notify_all()
                    return
                jobs = [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]
                self._busy = True
            try:
                self._handle(jobs)
            except Exception:  # the handler counts tier failures; this is a bug, keep running
                log.exception("kvtier cache writer %s failed on a batch", self.name)
                time.sleep(0.01)
            finally:
                for job in jobs:
                    if job.hold is not None:
                        job.hold.drop()
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
