"""Per-tier circuit breakers: back-off doubling, closing on success, one outage per run of
failures even when many threads fail at once."""

from __future__ import annotations

import threading
import time

from kvtier.cache.breaker import Breakers


def test_a_failure_opens_the_breaker_for_a_back_off_doubled_per_failure_in_a_row():
    b = Breakers(2, backoff_s=0.05, backoff_max_s=0.15)
    assert b.up(0) and b.up(1)
    first = b.failed(0)
    assert first.first and first.wait_s == 0.05 and not b.up(0) and b.up(1)
    assert [b.failed(0).wait_s for _ in range(3)] == [0.1, 0.15, 0.15]  # doubled, then capped
    time.sleep(0.2)
    assert b.up(0)  # the back-off is over: one call may try it
    assert b.succeeded(0) and not b.succeeded(0)  # closed once
    assert b.failed(0).wait_s == 0.05  # a new run of failures starts over


def test_threads_failing_at_once_count_one_outage_and_every_failure():
    b = Breakers(1, backoff_s=10.0, backoff_max_s=10.0)
    outages = []
    start = threading.Barrier(8)

    def fail() -> None:
        start.wait()
        for _ in range(100):
            outages.append(b.failed(0).first)

    threads = [threading.Thread(target=fail) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outages.count(True) == 1 and len(outages) == 800
    assert b._failures[0] == 800  # no increment lost
