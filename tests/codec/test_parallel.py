"""The decode threads: results in order, errors where they belong, inline on one core or once
closed, and the C decode really runs on several threads at once."""

from __future__ import annotations

import threading

import pytest

from kvtier.codec.parallel import Decoders


def test_map_keeps_the_order_and_uses_several_threads():
    seen: set[str] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(2, timeout=10)

    def work(i: int) -> int:
        with lock:
            seen.add(threading.current_thread().name)
        if i < 2:
            barrier.wait()  # the first two items must run at the same time
        return i * i

    decoders = Decoders(2)
    try:
        assert decoders.map(work, [(i,) for i in range(10)]) == [i * i for i in range(10)]
    finally:
        decoders.close()
    assert len(seen) == 2 and all(name.startswith("kvtier-decode") for name in seen)


def test_one_thread_or_a_closed_pool_runs_inline():
    me = threading.current_thread().name
    for decoders in (Decoders(1), Decoders(2)):
        decoders.close()
        assert not decoders.parallel
        assert decoders.map(lambda: threading.current_thread().name, [(), ()]) == [me, me]
        assert decoders.submit(lambda x: x + 1, 1).result() == 2


def test_an_error_reaches_the_caller():
    decoders = Decoders(2)

    def work(i: int) -> int:
        if i == 3:
            raise ValueError("three")
        return i

    try:
        with pytest.raises(ValueError, match="three"):
            decoders.map(work, [(i,) for i in range(6)])
        assert decoders.submit(work, 5).result() == 5
    finally:
        decoders.close()
