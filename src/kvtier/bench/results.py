"""Results of the storage benchmark: one row per (tier, op, depth), the lookup row, the report."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from kvtier.bench.env import BenchEnvironment
from kvtier.bench.stats import LatencyStats, PassResult
from kvtier.bench.storage_config import RAW_TWIN, StorageBenchConfig
from kvtier.specs import KiB
from kvtier.specs.jsonout import attrs

TARGET_MIN_BLOCK = 256 * KiB
LOOKUP_TARGET_S = 1e-3
#: The local-disk targets hold for both disk layouts: ``file://`` and ``slab://``.
TARGETS = {
    ("file", "read"): 0.9,
    ("file", "write"): 0.8,
    ("slab", "read"): 0.9,
    ("slab", "write"): 0.8,
    ("memory", "read"): 0.8,
    ("redis", "read"): 0.8,
    ("redis", "write"): 0.8,
    ("s3", "read"): 0.8,
    ("s3", "write"): 0.8,
}


#: Targets of a coded tier against its own twin with ``codec=raw`` (``--reference raw``), by
#: (payload, op): on real KV a read must deliver more raw bytes a second than the twin's, and on
#: bytes the codec cannot shrink (random) reads and writes may cost it little.
CODEC_TARGETS = {
    ("kv", "read"): 1.25,
    ("random", "read"): 0.95,
    ("random", "write"): 0.95,
}
#: The codec's target for a store and then a load of the same blocks, timed together, against
#: the raw twin, by payload: on bytes it cannot shrink the round trip may cost it little.
ROUND_TRIP_TARGETS = {"random": 0.95}


def verdict_of(ratio: float | None, target: float | None) -> str | None:
    """PASS/MISS of ``ratio`` against ``target``; None where either is missing."""
    if target is None or ratio is None:
        return None
    return "PASS" if ratio >= target else "MISS"


def target_for(
    scheme: str, op: str, block_bytes: int, reference: str = "", payload: str = "random"
) -> float | None:
    """The target ratio kvtier ÷ reference for a (tier medium, op), for blocks ≥ 256 KiB;
    against the tier's raw twin (``reference`` ``raw``), the codec's target for the payload."""
    if block_bytes < TARGET_MIN_BLOCK:
        return None
    if reference == RAW_TWIN:
        return CODEC_TARGETS.get((payload, op))
    return TARGETS.get((scheme, op))


class Judged(ABC):
    """A row judged by its ratio against a target: PASS, MISS, or None where either is
    missing."""

    @property
    @abstractmethod
    def ratio(self) -> float | None:
        """The measured ratio (None: not measured)."""

    @property
    @abstractmethod
    def target(self) -> float | None:
        """The ratio the row must reach (None: no target applies)."""

    @property
    def verdict(self) -> str | None:
        """PASS/MISS against the target, None where no target applies."""
        return verdict_of(self.ratio, self.target)

    def judgement(self) -> dict[str, Any]:
        """The ratio, target and verdict as JSON-ready keys, in that order."""
        return attrs(self, "ratio", "target", "verdict")


@dataclass(frozen=True)
class Reference:
    """The reference pass a kvtier pass is compared with: ``fio``, ``copy``, ``client`` or
    ``raw`` (the same tier with ``codec=raw``)."""

    kind: str
    result: PassResult
    detail: str = ""
    samples_gbps: tuple[float, ...] = ()

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "kind": self.kind,
            **self.result.as_dict(),
            "samples_gbps": list(self.samples_gbps) or [self.result.gbps],
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Measurement(Judged):
    """One (tier, op, depth) row: kvtier's pass, its reference, and the target ratio.

    ``drive`` says how the depth was reached: ``threads`` (that many caller threads) or
    ``native`` (one caller, the tier's own I/O depth); a request holds ``request_blocks`` blocks.
    ``result`` is the pass of median bandwidth among the repeats, whose rates are in
    ``samples_gbps``; each repeat ran in ``slices`` consecutive slices, each next to the
    reference's run of the same slice.
    """

    tier: str
    url: str
    scheme: str
    op: str
    depth: int
    drive: str
    request_blocks: int
    block_bytes: int
    chunk_tokens: int
    result: PassResult
    reference: Reference | None = None
    samples_gbps: tuple[float, ...] = ()
    slices: int = 1
    payload: str = "random"

    @property
    def target(self) -> float | None:
        """The issue's target ratio for this row, if any."""
        kind = self.reference.kind if self.reference is not None else ""
        return target_for(self.scheme, self.op, self.block_bytes, kind, self.payload)

    @property
    def tokens_per_s(self) -> float:
        """Cached tokens moved per second (blocks/s × tokens per block)."""
        return self.result.bandwidth / self.block_bytes * self.chunk_tokens

    @property
    def ratio(self) -> float | None:
        """kvtier GB/s ÷ reference GB/s."""
        if self.reference is None or self.reference.result.bandwidth <= 0:
            return None
        return self.result.bandwidth / self.reference.result.bandwidth

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            **attrs(self, "tier", "url", "op", "depth", "drive", "request_blocks", "block_bytes"),
            **self.result.as_dict(),
            "samples_gbps": list(self.samples_gbps) or [self.result.gbps],
            **attrs(self, "slices", "tokens_per_s"),
            "reference": self.reference.as_dict() if self.reference else None,
            **self.judgement(),
        }


@dataclass(frozen=True)
class RoundTrip(Judged):
    """A store and then a load of the same blocks at one depth, as one stretch of time: the
    seconds a byte takes to write plus those it takes to read, kvtier's against its raw twin's.

    ``gbps`` is the round trip's rate (bytes ÷ the write's and the read's seconds together);
    ``ratio`` is the twin's time ÷ kvtier's (above 1: kvtier is faster)."""

    write: Measurement
    read: Measurement

    @property
    def tier(self) -> str:
        """The tier's name."""
        return self.write.tier

    @property
    def depth(self) -> int:
        """Requests in flight."""
        return self.write.depth

    @staticmethod
    def _rate(write: PassResult, read: PassResult) -> float:
        return 1.0 / (1.0 / write.bandwidth + 1.0 / read.bandwidth)

    @property
    def gbps(self) -> float:
        """kvtier's round-trip rate, GB/s of payload."""
        return self._rate(self.write.result, self.read.result) / 1e9

    @property
    def reference_gbps(self) -> float:
        """The twin's round-trip rate, GB/s of payload."""
        assert self.write.reference is not None and self.read.reference is not None
        return self._rate(self.write.reference.result, self.read.reference.result) / 1e9

    @property
    def ratio(self) -> float:
        """kvtier's round-trip rate ÷ the twin's."""
        return self.gbps / self.reference_gbps

    @property
    def target(self) -> float | None:
        """The codec's round-trip target for the payload (blocks ≥ 256 KiB)."""
        if self.write.block_bytes < TARGET_MIN_BLOCK:
            return None
        return ROUND_TRIP_TARGETS.get(self.write.payload)

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {**attrs(self, "tier", "depth", "gbps", "reference_gbps"), **self.judgement()}


def round_trips(measurements: list[Measurement]) -> list[RoundTrip]:
    """The write and read rows of each (tier, depth) measured against the raw twin, paired."""
    twin = [
        m
        for m in measurements
        if m.reference is not None and m.reference.kind == RAW_TWIN and m.ratio is not None
    ]
    writes = {(m.tier, m.depth): m for m in twin if m.op == "write"}
    return [
        RoundTrip(writes[(m.tier, m.depth)], m)
        for m in twin
        if m.op == "read" and (m.tier, m.depth) in writes
    ]


@dataclass(frozen=True)
class LookupMeasurement:
    """Latency of ``TieredCache.lookup`` of a ``chunks``-chunk prefix held by the slowest tier."""

    chunks: int
    tokens: int
    tiers: tuple[str, ...]
    hit_chunks: int
    latency: LatencyStats
    target_s: float = LOOKUP_TARGET_S

    @property
    def verdict(self) -> str:
        """PASS when the median lookup is within the target and every chunk was found."""
        ok = self.latency.p50 <= self.target_s and self.hit_chunks == self.chunks
        return "PASS" if ok else "MISS"

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "chunks": self.chunks,
            "tokens": self.tokens,
            "tiers": list(self.tiers),
            "placement": "slowest tier (every faster tier is asked first)",
            "hit_chunks": self.hit_chunks,
            "latency_s": self.latency.as_dict(),
            "target_s": self.target_s,
            "verdict": self.verdict,
        }


@dataclass
class StorageReport:
    """Everything one ``kvtier bench storage`` run measured."""

    config: StorageBenchConfig
    environment: BenchEnvironment
    measurements: list[Measurement] = field(default_factory=list)
    lookup: LookupMeasurement | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def missed(self) -> list[str]:
        """Labels of the rows that missed their target."""
        out = [f"{m.tier} {m.op} depth {m.depth}" for m in self.measurements if m.verdict == "MISS"]
        trips = self.round_trips
        out += [f"{t.tier} store+load depth {t.depth}" for t in trips if t.verdict == "MISS"]
        if self.lookup is not None and self.lookup.verdict == "MISS":
            out.append("lookup")
        return out

    @property
    def round_trips(self) -> list[RoundTrip]:
        """Store + load of each (tier, depth) measured against its raw twin."""
        return round_trips(self.measurements)

    def as_dict(self) -> dict:
        """Plain JSON-ready dict (what ``--json`` prints)."""
        return {
            "benchmark": "storage",
            "config": self.config.as_dict(),
            "environment": self.environment.as_dict(),
            "results": [m.as_dict() for m in self.measurements],
            "round_trips": [t.as_dict() for t in self.round_trips],
            "lookup": self.lookup.as_dict() if self.lookup else None,
            "notes": list(self.notes),
        }
