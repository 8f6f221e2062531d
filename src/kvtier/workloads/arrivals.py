"""Seeded arrival processes: when the requests (or sessions) of a generated workload arrive.

Both return ``n`` arrival times in seconds, non-decreasing, the first at 0 (a workload starts
with its first arrival, as a replayed trace does), drawn from ``numpy.random.default_rng(seed)``
so the same arguments give the same times on every machine:

- :func:`poisson`: exponential gaps of mean ``1 / rate``;
- :func:`bursty`: gamma-distributed gaps of mean ``1 / rate`` and shape ``burstiness`` (the
  convention of ``vllm bench serve --burstiness``): shape 1 is Poisson, below 1 arrivals cluster
  into bursts separated by long lulls (coefficient of variation ``1 / sqrt(burstiness)``), above
  1 they come more evenly.
"""

from __future__ import annotations

import numpy as np

from kvtier.errors import ConfigError


def poisson(rate: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` arrival times (s) of a Poisson process of ``rate`` arrivals per second."""
    return bursty(rate, n, seed, burstiness=1.0)


def bursty(rate: float, n: int, seed: int = 0, *, burstiness: float = 0.25) -> np.ndarray:
    """``n`` arrival times (s) at ``rate`` per second on average, with gamma gaps of shape
    ``burstiness`` (below 1: bursts and lulls; 1: Poisson)."""
    if not rate > 0 or not np.isfinite(rate):
        raise ConfigError(f"arrival rate must be a positive number per second, got {rate}")
    if n < 0:
        raise ConfigError(f"the number of arrivals cannot be negative, got {n}")
    if not burstiness > 0 or not np.isfinite(burstiness):
        raise ConfigError(f"burstiness must be positive (1 is Poisson), got {burstiness}")
    rng = np.random.default_rng([seed, 0xA221])
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), max(n - 1, 0))
    out = np.zeros(n)
    np.cumsum(gaps, out=out[1:])
    return out


__all__ = ["bursty", "poisson"]
