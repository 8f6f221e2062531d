"""What the shared tiers have in common: calls bounded on threads of their own, byte windows."""

from __future__ import annotations

import threading
import time

import pytest

from kvtier.tiers.shared import BoundedCalls, byte_windows


def test_a_bounded_call_gives_its_result_its_error_or_up_at_its_deadline():
    calls = BoundedCalls("test", 2)
    assert calls(lambda: 5, 1.0, "a quick call") == 5
    with pytest.raises(ZeroDivisionError):
        calls(lambda: 1 // 0, 1.0, "a failing call")
    hung = threading.Event()
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"a hung call took over 0\.100 s"):
        calls(hung.wait, 0.1, "a hung call")
    assert time.monotonic() - began < 0.5
    assert calls.overdue == 1
    assert calls(lambda: 6, 1.0, "a call beside it") == 6  # a thread is still free
    hung.set()
    deadline = time.monotonic() + 5
    while calls.overdue:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    calls.join()


def test_calls_fail_at_once_while_every_thread_waits_on_a_hung_one():
    calls = BoundedCalls("test", 2)
    hung = threading.Event()
    for _ in range(2):
        with pytest.raises(TimeoutError):
            calls(hung.wait, 0.05, "a hung call")
    dropped: list[bool] = []
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="2 calls still wait for the server; a put not sent"):
        calls(lambda: 7, 5.0, "a put", on_drop=lambda: dropped.append(True))
    assert time.monotonic() - began < 0.5 and dropped == [True]  # never queued behind them
    hung.set()
    deadline = time.monotonic() + 5
    while calls.overdue:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert calls(lambda: 8, 1.0, "a call once they returned") == 8
    calls.close()


def test_byte_windows_bound_bytes_and_optionally_items():
    assert byte_windows([1] * 5, 100) == [(0, 5)]
    assert byte_windows([1] * 5, 100, most=2) == [(0, 2), (2, 4), (4, 5)]
    assert byte_windows([60, 60, 10], 100, most=2) == [(0, 1), (1, 3)]
    assert byte_windows([], 10, most=1) == []
