"""``kvtier bench storage``: write then read KV-shaped blocks through each tier and a reference.

For every tier and every depth: a write pass (``put_many``) of fresh blocks, a read pass
(``get_many_into``) of the same blocks, then the same pattern through the reference: fio on the
disk tier's directory (same block size, depth, O_DIRECT and engine as the tier), or plain copies
between preallocated buffers for the memory tier. Rates are decimal GB/s of payload.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from kvtier.bench.driver import PassPlan, run_pass
from kvtier.bench.env import BenchEnvironment, drop_caches
from kvtier.bench.fio import FioError, FioJob, fio_binary, fio_version, run_fio
from kvtier.bench.reference import CopyReference, WorkerBuffers
from kvtier.bench.stats import LatencyStats, PassResult
from kvtier.codec import BlockMeta
from kvtier.codec.container import DTYPES, HEADER_SIZE
from kvtier.errors import ConfigError, KvtierError
from kvtier.keys import Namespace
from kvtier.specs import KiB, MiB, ModelSpec, format_bytes, get_model
from kvtier.specs.model import dtype_bytes
from kvtier.tiers import Tier, open_tier

StepCallback = Callable[[str], None]
TARGET_MIN_BLOCK = 256 * KiB
LOOKUP_TARGET_S = 1e-3
DEFAULT_DATA = 512 * MiB


class BenchError(KvtierError):
    """A benchmark pass went wrong (lost blocks, tier full, reference failed)."""


@dataclass(frozen=True)
class StorageBenchConfig:
    """What ``kvtier bench storage`` measures.

    ``block_size`` defaults to the model's KV bytes per token × ``chunk_tokens``; ``data_size`` is
    the bytes written (and read back) per tier and depth; ``batch`` blocks go in one request.
    """

    tiers: tuple[str, ...]
    model: str = "smollm2-135m"
    chunk_tokens: int = 256
    block_size: int | None = None
    depths: tuple[int, ...] = (1, 4, 16)
    data_size: int = DEFAULT_DATA
    batch: int = 1
    min_read_seconds: float = 0.3
    fio: bool = True
    lookup: bool = True
    lookup_chunks: int = 512
    lookup_repeats: int = 200

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("give at least one tier, e.g. --tier 'memory://?size=2GiB'")
        if not self.depths or min(self.depths) < 1:
            raise ConfigError(f"depths must be positive integers, got {self.depths}")
        if self.chunk_tokens <= 0 or self.batch <= 0:
            raise ConfigError("chunk tokens and batch must be positive")
        if self.block_size is not None and self.block_size <= 0:
            raise ConfigError("block size must be positive")
        if self.data_size <= 0:
            raise ConfigError("data size must be positive")

    @property
    def spec(self) -> ModelSpec:
        """The model whose KV geometry shapes the blocks."""
        return get_model(self.model)

    @property
    def block_bytes(self) -> int:
        """Payload bytes per block."""
        if self.block_size is not None:
            return self.block_size
        return int(self.spec.kv_bytes_per_token() * self.chunk_tokens)

    @property
    def blocks(self) -> int:
        """Blocks per pass: the data size in whole blocks, at least one per thread."""
        return max(math.ceil(self.data_size / self.block_bytes), max(self.depths))

    @property
    def block_meta(self) -> BlockMeta:
        """The KV layout (layers, 2, kv_heads, chunk_tokens, head_dim) when it is the block."""
        spec = self.spec
        shape = (spec.layers, 2, spec.kv_heads, self.chunk_tokens, spec.head_dim)
        if (
            self.block_size is None
            and spec.attention != "mla"
            and spec.kv_dtype in DTYPES
            and math.prod(shape) * dtype_bytes(spec.kv_dtype) == self.block_bytes
        ):
            return BlockMeta(spec.kv_dtype, shape)
        return BlockMeta("u8", (self.block_bytes,))

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "tiers": list(self.tiers),
            "model": self.model,
            "chunk_tokens": self.chunk_tokens,
            "block_bytes": self.block_bytes,
            "blocks": self.blocks,
            "depths": list(self.depths),
            "data_bytes": self.blocks * self.block_bytes,
            "batch": self.batch,
            "min_read_seconds": self.min_read_seconds,
            "fio": self.fio,
        }


@dataclass(frozen=True)
class Reference:
    """The reference pass a kvtier pass is compared with."""

    kind: str  # "fio" or "copy"
    result: PassResult
    detail: str = ""

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {"kind": self.kind, **self.result.as_dict(), "detail": self.detail}


@dataclass(frozen=True)
class Measurement:
    """One (tier, op, depth) row: kvtier's pass, its reference, and the target ratio."""

    tier: str
    url: str
    op: str  # "read" or "write"
    depth: int
    block_bytes: int
    chunk_tokens: int
    result: PassResult
    reference: Reference | None = None
    target: float | None = None

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

    @property
    def verdict(self) -> str | None:
        """PASS/MISS against the target, None where no target applies."""
        if self.target is None or self.ratio is None:
            return None
        return "PASS" if self.ratio >= self.target else "MISS"

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "tier": self.tier,
            "url": self.url,
            "op": self.op,
            "depth": self.depth,
            "block_bytes": self.block_bytes,
            **self.result.as_dict(),
            "tokens_per_s": self.tokens_per_s,
            "reference": self.reference.as_dict() if self.reference else None,
            "ratio": self.ratio,
            "target": self.target,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class LookupMeasurement:
    """Latency of ``TieredCache.lookup`` over a prefix of ``chunks`` stored chunks."""

    chunks: int
    tokens: int
    tiers: tuple[str, ...]
    hit_chunks: int
    latency: LatencyStats
    target_s: float = LOOKUP_TARGET_S

    @property
    def verdict(self) -> str:
        """PASS when the median lookup is within the target."""
        return "PASS" if self.latency.p50 <= self.target_s else "MISS"

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "chunks": self.chunks,
            "tokens": self.tokens,
            "tiers": list(self.tiers),
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

    def as_dict(self) -> dict:
        """Plain JSON-ready dict (what ``--json`` prints)."""
        return {
            "benchmark": "storage",
            "config": self.config.as_dict(),
            "environment": self.environment.as_dict(),
            "results": [m.as_dict() for m in self.measurements],
            "lookup": self.lookup.as_dict() if self.lookup else None,
            "notes": list(self.notes),
        }


# --- tier-specific knowledge -------------------------------------------------------------------


@dataclass(frozen=True)
class DiskIOProfile:
    """How a file tier does its I/O, so that fio can do the same."""

    directory: Path
    ioengine: str
    direct: bool
    align: int = 4096


def disk_io_profile(tier: Tier) -> DiskIOProfile | None:
    """The I/O profile of a file tier (None for other media)."""
    if tier.scheme != "file":
        return None
    directory = Path(getattr(tier, "directory", None) or getattr(tier, "path", "."))
    engine = getattr(tier, "ioengine", None) or (
        "io_uring" if getattr(tier, "uses_io_uring", False) else "psync"
    )
    direct = bool(getattr(tier, "direct", getattr(tier, "o_direct", True)))
    align = int(getattr(tier, "align", 4096) or 4096)
    return DiskIOProfile(directory, engine, direct, align)


def target_for(scheme: str, op: str, block_bytes: int) -> float | None:
    """The issue's target ratio for a (tier medium, op) at this block size, if any."""
    if block_bytes < TARGET_MIN_BLOCK:
        return None
    return {("file", "read"): 0.9, ("file", "write"): 0.8, ("memory", "read"): 0.8}.get(
        (scheme, op)
    )


def default_tier_urls(directory: Path | None = None, data_size: int = DEFAULT_DATA) -> list[str]:
    """memory plus a disk directory (``./.kvtier/bench`` unless given), each sized for the data."""
    directory = (directory or Path.cwd() / ".kvtier" / "bench").resolve()
    size_mib = max(1024, math.ceil(2 * data_size / MiB))
    return [f"memory://?size={size_mib}MiB", f"file://{directory}?size={size_mib}MiB"]


# --- the run -----------------------------------------------------------------------------------


class StorageBench:
    """Runs the storage benchmark described by a config; ``on_step`` hears each finished step."""

    def __init__(self, config: StorageBenchConfig, on_step: StepCallback | None = None):
        self.config = config
        self.on_step = on_step or (lambda _label: None)
        self.namespace = Namespace.for_model(config.spec, "kvtier-bench").id
        self.fio = fio_binary() if config.fio else None
        self._nonce = os.urandom(8)

    def steps(self) -> int:
        """Steps ``run`` will report: 4 per tier and depth, plus the lookup."""
        return 4 * len(self.config.tiers) * len(self.config.depths) + int(self.config.lookup)

    def run(self) -> StorageReport:
        """Measure every tier at every depth; the lookup last."""
        cfg = self.config
        tiers = [open_tier(url, self.namespace) for url in cfg.tiers]
        try:
            disk = next((p for p in map(disk_io_profile, tiers) if p), None)
            env = BenchEnvironment.probe(
                disk.directory if disk else None, fio_version(self.fio) if self.fio else None
            )
            report = StorageReport(cfg, env)
            self._notes(report, tiers, disk)
            for url, tier in zip(cfg.tiers, tiers, strict=True):
                report.measurements += self._bench_tier(url, tier, report)
            if cfg.lookup:
                report.lookup = self._lookup(tiers, report)
                self.on_step("lookup")
            return report
        finally:
            for tier in tiers:
                tier.close()

    # --- one tier ---------------------------------------------------------------------------
    def _bench_tier(self, url: str, tier: Tier, report: StorageReport) -> list[Measurement]:
        cfg = self.config
        block, items = cfg.block_bytes, cfg.blocks
        self._check_capacity(url, tier, items, block)
        profile = disk_io_profile(tier)
        copy_ref = CopyReference(items, block, cfg.batch) if tier.scheme == "memory" else None
        payloads = WorkerBuffers(block, cfg.batch, fill=0)
        outs = WorkerBuffers(block, cfg.batch, fill=0)
        rng = np.random.default_rng()
        for row in payloads.ensure(max(cfg.depths)):
            for buf in row:
                buf[:] = rng.integers(0, 256, block, dtype=np.uint8)
        rows: list[Measurement] = []
        try:
            for depth in cfg.depths:
                plan = PassPlan(items, block, depth, cfg.batch)
                read_plan = PassPlan(items, block, depth, cfg.batch, cfg.min_read_seconds)
                keys = self._keys(url, depth, items)
                label = f"{tier.name} depth {depth}"
                write = self._write(tier, keys, plan, payloads)
                self.on_step(f"{label}: kvtier write")
                if profile and not profile.direct:
                    drop_caches()
                read = self._read(tier, keys, read_plan, outs)
                self.on_step(f"{label}: kvtier read")
                tier.delete_many(keys)
                refs = self._reference(tier, profile, copy_ref, plan, read_plan, report)
                self.on_step(f"{label}: reference")
                for op, result in (("write", write), ("read", read)):
                    rows.append(
                        Measurement(
                            tier.name,
                            url,
                            op,
                            depth,
                            block,
                            cfg.chunk_tokens,
                            result,
                            refs.get(op),
                            target_for(tier.scheme, op, block),
                        )
                    )
        finally:
            if copy_ref:
                copy_ref.close()
            payloads.clear()
            outs.clear()
        return rows

    def _keys(self, url: str, depth: int, items: int) -> list[bytes]:
        seed = self._nonce + url.encode() + depth.to_bytes(4, "little")
        return [xxhash.xxh3_128_digest(seed + i.to_bytes(8, "little")) for i in range(items)]

    def _check_capacity(self, url: str, tier: Tier, items: int, block: int) -> None:
        need = items * (block + HEADER_SIZE + 4096)
        capacity = tier.usage().capacity_bytes
        if capacity and need > capacity:
            raise ConfigError(
                f"tier {url} holds {format_bytes(capacity)} but one pass writes "
                f"{format_bytes(need)}; raise its size= or lower --data-size"
            )

    def _write(
        self, tier: Tier, keys: Sequence[bytes], plan: PassPlan, payloads: WorkerBuffers
    ) -> PassResult:
        buffers = payloads.ensure(plan.threads)
        meta = self.config.block_meta
        rejected: list[int] = []

        def work(worker: int, indices: Sequence[int]) -> None:
            bufs = buffers[worker]
            items = []
            for j, i in enumerate(indices):
                bufs[j][:8] = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)
                items.append((keys[i], bufs[j], meta))
            ok = tier.put_many(items)
            rejected.extend(i for i, good in zip(indices, ok, strict=True) if not good)

        result = run_pass(plan, work)
        if rejected:
            raise BenchError(
                f"tier {tier.name} refused {len(rejected)} of {plan.items} blocks; "
                "give it more room (size=) or lower --data-size"
            )
        return result

    def _read(
        self, tier: Tier, keys: Sequence[bytes], plan: PassPlan, outs: WorkerBuffers
    ) -> PassResult:
        buffers = outs.ensure(plan.threads)
        bad: list[str] = []

        def work(worker: int, indices: Sequence[int]) -> None:
            bufs = buffers[worker][: len(indices)]
            results = tier.get_many_into([keys[i] for i in indices], bufs)
            for i, buf, res in zip(indices, bufs, results, strict=True):
                if res is None or isinstance(res, Exception):
                    bad.append(f"block {i}: {res or 'miss'}")
                elif int.from_bytes(buf[:8].tobytes(), "little") != i:
                    bad.append(f"block {i}: wrong payload")

        result = run_pass(plan, work)
        if bad:
            raise BenchError(
                f"tier {tier.name} lost {len(bad)} block reads (first: {bad[0]}); "
                "is it large enough for --data-size?"
            )
        return result

    def _reference(
        self,
        tier: Tier,
        profile: DiskIOProfile | None,
        copy_ref: CopyReference | None,
        plan: PassPlan,
        read_plan: PassPlan,
        report: StorageReport,
    ) -> dict[str, Reference]:
        if copy_ref is not None:
            detail = f"numpy.copyto, {plan.threads} threads"
            return {
                "write": Reference("copy", copy_ref.write(plan), detail),
                "read": Reference("copy", copy_ref.read(read_plan), detail),
            }
        if profile is None or self.fio is None:
            return {}
        out: dict[str, Reference] = {}
        bs = -(-(self.config.block_bytes + HEADER_SIZE) // profile.align) * profile.align
        fname = f"kvtier-fio-{os.getpid()}.dat"
        try:
            for op, min_s in (("write", 0.0), ("read", read_plan.min_seconds)):
                job = FioJob(
                    profile.directory,
                    op,
                    bs,
                    plan.items,
                    plan.depth,
                    profile.ioengine,
                    profile.direct,
                    fname,
                    min_seconds=min_s,
                )
                res = run_fio(job, self.fio)
                out[op] = Reference("fio", res.result, " ".join(res.command[1:]))
        except FioError as exc:
            report.notes.append(f"fio reference skipped for {tier.name}: {exc}")
        finally:
            (profile.directory / fname).unlink(missing_ok=True)
        return out

    # --- lookup -----------------------------------------------------------------------------
    def _lookup(self, tiers: Sequence[Tier], report: StorageReport) -> LookupMeasurement | None:
        try:
            from kvtier.cache import TieredCache
        except ImportError:
            report.notes.append("lookup row skipped: kvtier.cache is not available yet")
            return None
        return measure_lookup(
            TieredCache,
            tiers,
            self.config.lookup_chunks,
            self.config.chunk_tokens,
            self.config.lookup_repeats,
            self.config.spec,
        )

    def _notes(self, report: StorageReport, tiers: Sequence[Tier], disk: DiskIOProfile | None):
        env = report.environment
        if disk is not None:
            if disk.direct:
                report.notes.append(
                    "disk tier uses O_DIRECT: reads bypass the page cache, no cache drop needed"
                )
            elif env.can_drop_caches:
                report.notes.append("disk tier is buffered: page cache dropped before each read")
            else:
                report.notes.append(
                    "disk tier is buffered and this process cannot drop the page cache "
                    "(not root): its reads may be served from memory"
                )
            if env.o_direct is False:
                report.notes.append(
                    f"{disk.directory} ({env.filesystem}) does not support O_DIRECT; "
                    "use --dir on a real disk for meaningful disk numbers"
                )
        if self.config.fio and self.fio is None and disk is not None:
            report.notes.append("fio is not installed: no disk reference (apt-get install fio)")
        if self.config.block_bytes < TARGET_MIN_BLOCK:
            report.notes.append(
                f"blocks of {format_bytes(self.config.block_bytes)} are below 256 KiB: "
                "ratios are shown without targets"
            )


def measure_lookup(cache_cls, tiers, chunks, chunk_tokens, repeats, spec) -> LookupMeasurement:
    """Placeholder until the cache lands."""
    raise NotImplementedError
