"""Links are FCFS queues: transfers contend, a pipeline ends with its slowest stage."""

import pytest

from kvtier.errors import ConfigError
from kvtier.sim.links import Leg, LinkQueue, book, unbooked_seconds


def test_transfers_on_one_link_queue_behind_each_other():
    link = LinkQueue("nvme", 1e9, latency_s=1e-3)
    first = book(0.0, [Leg(link, 1e9)])
    second = book(0.0, [Leg(link, 1e9)])
    assert first.end == pytest.approx(1.001) and second.end == pytest.approx(2.001)
    assert link.use.busy_s == pytest.approx(2.0) and link.use.bytes_moved == 2e9
    assert link.backlog_s(0.5) == pytest.approx(1.5)


def test_a_pipeline_takes_its_slowest_stage_and_every_latency():
    disk, pcie = LinkQueue("disk", 1e9, 1e-4), LinkQueue("pcie", 5e9, 1e-5)
    legs = [Leg(disk, 2e9), Leg(pcie, 2e9)]
    assert unbooked_seconds(legs) == pytest.approx(2.0 + 1.1e-4)
    assert book(0.0, legs).end == pytest.approx(2.0 + 1.1e-4)
    # a read at another rate (NVMe writes are slower than reads) holds the queue longer
    assert book(0.0, [Leg(disk, 1e9, rate=0.5e9)]).end == pytest.approx(4.0001)


def test_a_link_needs_a_bandwidth():
    with pytest.raises(ConfigError):
        LinkQueue("x", 0)
