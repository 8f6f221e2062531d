"""Latency and throughput summaries shared by every benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from kvtier.specs.jsonout import attrs

GB = 1e9


@dataclass(frozen=True)
class LatencyStats:
    """Per-request latency in seconds: count, mean, p50/p95/p99 and max."""

    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def from_samples(cls, seconds: Sequence[float] | np.ndarray) -> LatencyStats:
        """Summarize raw samples (seconds); an empty sample gives all zeros."""
        a = np.asarray(seconds, dtype=np.float64)
        if a.size == 0:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        p50, p95, p99 = np.percentile(a, [50, 95, 99])
        return cls(int(a.size), float(a.mean()), float(p50), float(p95), float(p99), float(a.max()))

    def as_dict(self) -> dict[str, float | int]:
        """Plain JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class PassResult:
    """One timed pass: bytes moved, wall seconds, and the latency of each request."""

    bytes: int
    seconds: float
    requests: int
    latency: LatencyStats

    @property
    def bandwidth(self) -> float:
        """Bytes per second over the whole pass."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def gbps(self) -> float:
        """Decimal GB/s (1e9 bytes per second), the unit fio and MLPerf Storage report."""
        return self.bandwidth / GB

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            **attrs(self, "bytes", "seconds", "requests", "gbps"),
            "latency_s": self.latency.as_dict(),
        }


def median_pass(passes: Sequence[PassResult]) -> PassResult:
    """The pass of median bandwidth (the lower middle one for an even count)."""
    if not passes:
        raise ValueError("median_pass needs at least one pass")
    ranked = sorted(passes, key=lambda p: p.bandwidth)
    return ranked[(len(ranked) - 1) // 2]


def combine_passes(passes: Sequence[PassResult]) -> PassResult:
    """One pass made of consecutive slices: bytes, seconds and requests add up.

    Latency percentiles of the whole are the request-weighted means of the slices' percentiles
    (fio gives no raw samples to pool); count, mean and max are exact.
    """
    if not passes:
        raise ValueError("combine_passes needs at least one pass")
    if len(passes) == 1:
        return passes[0]
    count = sum(p.latency.count for p in passes)

    def weighted(field: str) -> float:
        if count == 0:
            return 0.0
        return sum(getattr(p.latency, field) * p.latency.count for p in passes) / count

    latency = LatencyStats(
        count,
        weighted("mean"),
        weighted("p50"),
        weighted("p95"),
        weighted("p99"),
        max(p.latency.max for p in passes),
    )
    return PassResult(
        bytes=sum(p.bytes for p in passes),
        seconds=sum(p.seconds for p in passes),
        requests=sum(p.requests for p in passes),
        latency=latency,
    )


def pearson_r(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation of paired samples; None where either side has no spread."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def median_ratio_interval(
    num: Sequence[float],
    den: Sequence[float],
    level: float = 0.9,
    draws: int = 4000,
    statistic=np.median,
    paired: bool = False,
) -> tuple[float, float] | None:
    """A percentile-bootstrap interval of median(num) / median(den) (or of another
    ``statistic``, e.g. ``np.mean``): each sample's rounds drawn again with replacement,
    independently, ``draws`` times (a fixed seed: the same rounds give the same interval). None
    with fewer than two rounds on either side. ``paired``: ``num[i]`` and ``den[i]`` measure
    the same thing (the same request sent to two systems), so both are drawn with the same
    indices and what the two share does not widen the interval.

    A round-to-round spread larger than the effect looked for shows here as an interval wider
    than the gap between the ratio and its threshold."""
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if a.size < 2 or b.size < 2 or not (b > 0).all():
        return None
    if paired and a.size != b.size:
        raise ValueError(f"paired samples differ in size: {a.size} and {b.size}")
    rng = np.random.default_rng(0)
    picks = rng.integers(0, a.size, (draws, a.size))
    ma = statistic(a[picks], axis=1)
    mb = statistic(b[picks if paired else rng.integers(0, b.size, (draws, b.size))], axis=1)
    lo, hi = np.percentile(ma / mb, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)
