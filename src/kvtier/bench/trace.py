"""``kvtier bench trace``: replay an MLPerf KV-cache I/O trace through a kvtier tier stack.

Every traced object (one request's whole KV) is cut into chunks of ``chunk_bytes`` stored
under keys derived from the trace's object key. A ``write`` stores its chunks through every
tier of a :class:`~kvtier.cache.TieredCache` and waits until they are written; a ``read`` looks
the object up and loads its chunks into host buffers; a read that loads every chunk is a hit.
Operations run one after the other, as fast as the tiers allow (the trace's timestamps are not
waited for). Payloads are random bytes, like the benchmark's own (uniform fp16 noise).

Reported like the benchmark reports: read and write GB/s (decimal, object bytes over the time
spent in reads or writes), P95 read and write latency per object, read tokens/s (object bytes
÷ bytes per token of the model), and the hit rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from kvtier.bench.stats import LatencyStats
from kvtier.cache import CacheConfig, TieredCache
from kvtier.codec import BlockMeta
from kvtier.errors import ConfigError
from kvtier.keys import Namespace
from kvtier.specs import MiB, get_model
from kvtier.tiers import open_tier
from kvtier.workloads.mlperf import TraceOp

_POOL = 4  # distinct random chunk payloads


@dataclass(frozen=True)
class TraceConfig:
    """What a replay runs: the tier stack, chunk size, bytes per token, and how many ops."""

    tiers: tuple[str, ...]
    chunk_bytes: int = 4 * MiB
    model: str = "smollm2-135m"
    bytes_per_token: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("give at least one tier, e.g. --tier 'slab:///nvme/kv?size=8GiB'")
        if self.chunk_bytes < 1:
            raise ConfigError("the chunk size must be positive")
        if self.bytes_per_token is not None and self.bytes_per_token < 1:
            raise ConfigError("bytes per token must be positive")
        if self.limit is not None and self.limit < 1:
            raise ConfigError("the operation limit must be positive")

    @property
    def token_bytes(self) -> int:
        """KV bytes per token: given, or the model preset's."""
        if self.bytes_per_token is not None:
            return self.bytes_per_token
        return int(get_model(self.model).kv_bytes_per_token())


@dataclass
class TraceReport:
    """The replay's figures (see the module docstring)."""

    config: TraceConfig
    reads: int = 0
    writes: int = 0
    hits: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    read_latency: list[float] = field(default_factory=list, repr=False)
    write_latency: list[float] = field(default_factory=list, repr=False)

    @property
    def read_gbps(self) -> float:
        return self.read_bytes / self.read_seconds / 1e9 if self.read_seconds else 0.0

    @property
    def write_gbps(self) -> float:
        return self.write_bytes / self.write_seconds / 1e9 if self.write_seconds else 0.0

    @property
    def hit_rate(self) -> float:
        """Reads that loaded every chunk of their object, of all reads."""
        return self.hits / self.reads if self.reads else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Tokens of KV read per second of reading."""
        if not self.read_seconds:
            return 0.0
        return self.read_bytes / self.config.token_bytes / self.read_seconds

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "tiers": list(self.config.tiers),
            "chunk_bytes": self.config.chunk_bytes,
            "bytes_per_token": self.config.token_bytes,
            "reads": self.reads,
            "writes": self.writes,
            "hits": self.hits,
            "hit_rate": self.hit_rate,
            "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes,
            "read_gbps": self.read_gbps,
            "write_gbps": self.write_gbps,
            "read_latency": LatencyStats.from_samples(self.read_latency).as_dict(),
            "write_latency": LatencyStats.from_samples(self.write_latency).as_dict(),
            "read_tokens_per_s": self.tokens_per_s,
        }


def object_keys(key: str, chunks: int) -> list[bytes]:
    """The chunk keys of a traced object."""
    base = key.encode()
    return [xxhash.xxh3_128_digest(base + i.to_bytes(4, "little")) for i in range(chunks)]


def replay(
    ops: Sequence[TraceOp], config: TraceConfig, on_op: Callable[[], None] | None = None
) -> TraceReport:
    """Run ``ops`` (the first ``config.limit``) through the tiers; the report of what it took."""
    ops = list(ops[: config.limit] if config.limit else ops)
    chunk = config.chunk_bytes
    namespace = Namespace("mlperf-kv-trace", "replay", "u8", 1, 1, 1)
    largest = max((op.size for op in ops), default=0)
    max_chunks = max(1, -(-largest // chunk))
    rng = np.random.default_rng(0)
    pool = [rng.integers(0, 256, chunk, dtype=np.uint8) for _ in range(_POOL)]
    outs = [np.empty(chunk, np.uint8) for _ in range(max_chunks)]
    tiers = []
    try:
        for url in config.tiers:
            tiers.append(open_tier(url, namespace.id))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    cache = TieredCache(
        tiers, CacheConfig(chunk_tokens=1, block_bytes=chunk, queue_chunks=max(256, max_chunks))
    )
    report = TraceReport(config)
    meta = BlockMeta()
    try:
        for op in ops:
            n = max(1, -(-op.size // chunk))
            keys = object_keys(op.key, n)
            sizes = [chunk] * (n - 1) + [op.size - chunk * (n - 1) or chunk]
            began = time.perf_counter()
            if op.op == "write":
                payloads = [pool[i % _POOL][:s] for i, s in enumerate(sizes)]
                cache.store(keys, payloads, meta, copy=False)
                cache.flush()
                seconds = time.perf_counter() - began
                report.writes += 1
                report.write_bytes += op.size
                report.write_seconds += seconds
                report.write_latency.append(seconds)
            else:
                found = cache.lookup(keys)
                loaded = cache.load(keys, outs[:n], found).loaded if found.hit_chunks else 0
                seconds = time.perf_counter() - began
                report.reads += 1
                report.hits += loaded == n
                report.read_bytes += sum(sizes[:loaded])
                report.read_seconds += seconds
                report.read_latency.append(seconds)
            if on_op is not None:
                on_op()
    finally:
        cache.close()
        for tier in tiers:
            tier.close()
    return report


__all__ = ["TraceConfig", "TraceReport", "object_keys", "replay"]
