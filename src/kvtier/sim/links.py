"""Links as first-come-first-served queues: bytes take bandwidth-time, so transfers contend.

A :class:`LinkQueue` is one direction of one path (a PCIe direction, an NVMe drive, a NIC, a
shared store's service): a transfer waits until the queue is free, holds it for
``bytes / bandwidth`` and arrives ``latency_s`` later. A transfer over several queues (storage,
then the host link) is a pipeline: it starts on each as soon as that one is free, and ends when
its slowest stage has moved the bytes, plus the latencies. Each queue counts its bytes and busy
seconds for the utilisation report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.errors import ConfigError


@dataclass
class LinkUse:
    """What a link has carried: bytes, seconds it was busy, transfers."""

    bytes_moved: float = 0.0
    busy_s: float = 0.0
    transfers: int = 0


@dataclass
class LinkQueue:
    """One FCFS link: ``bandwidth`` bytes/s, ``latency_s`` per transfer, busy until
    ``free_at``; ``use`` counts what it moved."""

    name: str
    bandwidth: float
    latency_s: float = 0.0
    free_at: float = 0.0
    use: LinkUse = field(default_factory=LinkUse)

    def __post_init__(self) -> None:
        if self.bandwidth <= 0 or self.latency_s < 0:
            raise ConfigError(f"link {self.name!r}: bandwidth must be positive, latency >= 0")

    def backlog_s(self, now: float) -> float:
        """Seconds a transfer offered now waits before it starts."""
        return max(0.0, self.free_at - now)

    def hold(self, begin: float, seconds: float, nbytes: float) -> float:
        """Take the link from ``begin`` for ``seconds`` to move ``nbytes``; when it is free."""
        self.free_at = begin + seconds
        self.use.busy_s += seconds
        self.use.bytes_moved += nbytes
        self.use.transfers += 1
        return self.free_at


@dataclass(frozen=True)
class Leg:
    """One stage of a transfer: ``nbytes`` over ``link`` at ``rate`` (None: the link's own)."""

    link: LinkQueue
    nbytes: float
    rate: float | None = None


@dataclass
class Transfer:
    """A finished booking: when it started moving and when the bytes are usable."""

    start: float
    end: float
    legs: list[Leg] = field(default_factory=list)


def book(now: float, legs: Sequence[Leg]) -> Transfer:
    """Book a pipelined transfer over ``legs`` starting no earlier than ``now``."""
    if not legs:
        return Transfer(now, now)
    start = min(max(now, leg.link.free_at) for leg in legs)
    end = now
    latency = 0.0
    for leg in legs:
        link = leg.link
        begin = max(now, link.free_at)
        hold = leg.nbytes / (leg.rate or link.bandwidth)
        end = max(end, link.hold(begin, hold, leg.nbytes))
        latency += link.latency_s
    return Transfer(start, end + latency, list(legs))


def unbooked_seconds(legs: Sequence[Leg]) -> float:
    """Seconds the transfer would take on idle links (its slowest stage plus the latencies)."""
    if not legs:
        return 0.0
    slowest = max(leg.nbytes / (leg.rate or leg.link.bandwidth) for leg in legs)
    return slowest + sum(leg.link.latency_s for leg in legs)


__all__ = ["Leg", "LinkQueue", "LinkUse", "Transfer", "book", "unbooked_seconds"]
