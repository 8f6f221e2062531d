"""A timed pass: ``depth`` threads share ``items`` blocks round-robin, in requests of ``batch``.

Every benchmark that compares kvtier with a reference (a tier vs a plain copy) drives both with
this same function, so thread count, request size and item order are identical on both sides.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.bench.stats import LatencyStats, PassResult
from kvtier.errors import ConfigError

Work = Callable[[int, Sequence[int]], None]
"""``work(worker, indices)`` performs one request for the items ``indices`` on thread ``worker``."""


@dataclass(frozen=True)
class PassPlan:
    """How a pass is cut: items, threads, items per request, and the minimum duration.

    With ``min_seconds`` > 0 each thread repeats its share until that much time has passed since
    the start (reads only: repeating a write would measure overwrites).
    """

    items: int
    item_bytes: int
    depth: int = 1
    batch: int = 1
    min_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.items <= 0 or self.item_bytes <= 0:
            raise ConfigError("a pass needs at least one item of at least one byte")
        if self.depth <= 0 or self.batch <= 0:
            raise ConfigError("depth and batch must be at least 1")

    @property
    def threads(self) -> int:
        """Threads actually started (never more than there are items)."""
        return min(self.depth, self.items)

    def requests_of(self, worker: int) -> list[list[int]]:
        """The requests (lists of item indices) of one thread, in order."""
        share = list(range(worker, self.items, self.threads))
        return [share[i : i + self.batch] for i in range(0, len(share), self.batch)]


def run_pass(plan: PassPlan, work: Work) -> PassResult:
    """Run ``work`` over the plan's requests on ``plan.threads`` threads; time every request.

    The clock starts when every thread is ready; the pass ends when the last thread is done.
    An exception in any thread stops the pass and is raised here.
    """
    threads = plan.threads
    start_line = threading.Barrier(threads + 1)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    moved = [0] * threads
    ends = [0.0] * threads
    errors: list[BaseException] = []
    stop = threading.Event()
    t0_box = [0.0]

    def loop(worker: int) -> None:
        requests = plan.requests_of(worker)
        lat = latencies[worker]
        clock = time.perf_counter
        try:
            start_line.wait()
            while True:
                for request in requests:
                    if stop.is_set():
                        return
                    t = clock()
                    work(worker, request)
                    lat.append(clock() - t)
                    moved[worker] += len(request)
                if plan.min_seconds <= 0 or clock() - t0_box[0] >= plan.min_seconds:
                    break
        except BaseException as exc:
            errors.append(exc)
            stop.set()
        finally:
            ends[worker] = time.perf_counter()

    pool = [
        threading.Thread(target=loop, args=(w,), name=f"kvtier-bench-{w}", daemon=True)
        for w in range(threads)
    ]
    for t in pool:
        t.start()
    t0_box[0] = time.perf_counter()
    start_line.wait()
    t0 = t0_box[0] = time.perf_counter()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    samples = [x for lat in latencies for x in lat]
    return PassResult(
        bytes=sum(moved) * plan.item_bytes,
        seconds=max(ends) - t0,
        requests=len(samples),
        latency=LatencyStats.from_samples(samples),
    )
