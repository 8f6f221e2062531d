"""The decode threads: results in order, errors where they belong, inline on one core or once
closed, and the C decode really runs on several threads at once."""

from __future__ import annotations

import os
import threading
import time

import pytest

from kvtier.codec.parallel import Decoders, EncodeAhead, spare_core


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


def test_encode_ahead_gives_each_item_once_in_any_order_and_starts_a_window_ahead():
    started: list[int] = []
    lock = threading.Lock()
    gate = threading.Event()

    def encode(i: int) -> int:
        with lock:
            started.append(i)
        if i == 7:
            gate.wait(10)  # the window must not wait for a slow item behind it
        return -i

    decoders = Decoders(2)
    try:
        ahead = EncodeAhead(decoders, [7, 3, 5, 1, 9], encode, window=2)
        assert ahead.get(3) == -3  # asking for 3 starts 7, 3 and the two after it
        deadline = time.monotonic() + 10
        while set(started) != {7, 3, 5, 1} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(started) == {7, 3, 5, 1}  # 9 waits until one of those is asked for
        gate.set()
        assert [ahead.get(i) for i in (7, 5, 1, 9)] == [-7, -5, -1, -9]
        assert ahead.get(9) == -9  # asked for twice: encoded again
        assert ahead.get(4) == -4  # not in the batch: inline
        ahead.cancel()
    finally:
        decoders.close()


def test_encode_ahead_encodes_a_batch_of_one_on_the_callers_thread():
    decoders = Decoders(2)
    try:
        ahead = EncodeAhead(decoders, [4], lambda _i: threading.current_thread().name, window=2)
        assert ahead.get(4) == threading.current_thread().name
    finally:
        decoders.close()


def test_encode_ahead_reraises_an_items_error_and_runs_inline_on_one_core():
    def encode(i: int) -> int:
        if i == 2:
            raise ValueError("two")
        return i

    for decoders in (Decoders(2), Decoders(1)):
        try:
            ahead = EncodeAhead(decoders, range(4), encode, window=3)
            assert ahead.get(0) == 0 and ahead.get(1) == 1
            with pytest.raises(ValueError, match="two"):
                ahead.get(2)
            assert ahead.get(3) == 3
        finally:
            decoders.close()


def test_a_codec_thread_has_no_spare_core_and_another_thread_has_one_where_it_may_run_on_two():
    """A block decoded on the pool's own threads stays on its thread (its neighbours decode the
    batch's other blocks); elsewhere it may take a second core when the process has one."""
    pool = Decoders(threads=2)
    try:
        assert pool.submit(spare_core).result() is False
    finally:
        pool.close()
    assert spare_core() is (len(os.sched_getaffinity(0)) > 1)
