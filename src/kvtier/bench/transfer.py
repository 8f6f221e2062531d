"""``kvtier bench transfer``: the transfer engine on a real model's paged KV, CPU or CUDA.

One run builds a paged KV pool in one of vLLM's layouts (torch alone, no vLLM) for a model
preset's geometry and measures, against references taken in the same run:

- **round trips**: chunks gathered from the pool, stored in each tier, read back and scattered
  into other blocks, compared byte for byte;
- **copies**: the engine's gather (blocks → host chunks) and scatter (host chunks → blocks), as
  GB/s and as a share of a plain copy of the same bytes (on CUDA: one pinned ``copy_`` each way;
  on CPU: one memcpy);
- **overlap**: a stand-in forward (per layer, matmuls of the model's hidden size over enough
  tokens to take about as long as that layer's load) alone and while a full load runs beside
  it; then the forward waiting for each layer of a load-per-layer, against waiting for the whole
  load first: when the first and the last layer became usable, and the total;
- **file reads and writes, staged and straight**: chunks in a ``file://`` tier read into the
  device through host memory (the tier's host path, then a copy) and straight into device
  memory (the tier's device verbs: GPUDirect Storage through kvikio on CUDA, with kvikio's mode
  recorded; POSIX reads into the tensors on CPU), and written both ways, bit-exact checked.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvtier.bench.transfer_kv import LAYOUT_ORDERS, KVShape, paged_kv
from kvtier.codec import BlockMeta
from kvtier.engines.transfer import LoadProgress, Placement, open_transfer_engine
from kvtier.errors import ConfigError
from kvtier.specs.host import cpu_description
from kvtier.specs.model import get_model
from kvtier.tiers.files.device_io import (
    DeviceFileIO,
    KvikioFileIO,
    PosixFileIO,
    compat_mode,
    require_gds,
)
from kvtier.tiers.files.per_block import DiskTier
from kvtier.tiers.registry import open_tier

TIERS = ("memory", "slab", "file")


@dataclass(frozen=True)
class TransferBenchConfig:
    """What ``kvtier bench transfer`` measures: the model's geometry, the device, vLLM's
    layout, the tokens moved per measurement, the tiers of the round trips."""

    model: str = "llama-3.1-8b"
    device: str = "cpu"
    layout: str = "LBNHC"
    block_size: int = 16
    chunk_tokens: int = 256
    tokens: int = 4096
    tiers: tuple[str, ...] = TIERS
    directory: Path | None = None
    repeats: int = 5
    ring_bytes: int = 512 << 20
    seed: int = 0

    def __post_init__(self) -> None:
        if self.layout not in LAYOUT_ORDERS:
            raise ConfigError(f"--layout {self.layout!r}: use one of {', '.join(LAYOUT_ORDERS)}")
        if self.chunk_tokens % self.block_size or self.chunk_tokens < self.block_size:
            raise ConfigError(
                f"--chunk-tokens {self.chunk_tokens} is not a whole number of "
                f"{self.block_size}-token blocks"
            )
        if self.tokens < self.chunk_tokens:
            raise ConfigError(f"--tokens must be at least one chunk ({self.chunk_tokens})")
        bad = [t for t in self.tiers if t not in TIERS]
        if bad:
            raise ConfigError(f"--tiers {','.join(bad)}: use some of {', '.join(TIERS)}")
        if self.repeats < 1:
            raise ConfigError(f"--repeat must be at least 1, got {self.repeats}")

    @property
    def chunks(self) -> int:
        """Chunks moved per measurement."""
        return self.tokens // self.chunk_tokens

    def shape(self) -> KVShape:
        """The pool: twice the blocks one measurement moves, plus the null block."""
        spec = get_model(self.model)
        blocks = 2 * self.chunks * (self.chunk_tokens // self.block_size) + 1
        return KVShape(spec.layers, blocks, spec.kv_heads, self.block_size, spec.head_dim)


@dataclass
class TransferReport:
    """The figures of one run (see the module docstring)."""

    config: dict[str, Any]
    device_name: str
    chunk_bytes: int
    round_trips: list[dict[str, Any]] = field(default_factory=list)
    copies: dict[str, dict[str, float]] = field(default_factory=dict)
    overlap: dict[str, float] = field(default_factory=dict)
    gds: dict[str, Any] = field(default_factory=dict)
    file_io: dict[str, Any] = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    """The median of ``repeats`` timed runs after one warm-up, the device synchronised."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _placements(config: TransferBenchConfig, layers: int, start: int) -> list[Placement]:
    """``config.chunks`` chunks of consecutive-looking but shuffled blocks from ``start`` on."""
    per = config.chunk_tokens // config.block_size
    rng = np.random.default_rng(config.seed + start)
    ids = rng.permutation(config.chunks * per) + start
    return [
        Placement.same(ids[c * per : (c + 1) * per].tolist(), layers) for c in range(config.chunks)
    ]


def _same_blocks(views, a: Placement, b: Placement) -> bool:
    """Whether blocks ``b`` hold exactly what blocks ``a`` hold, in every layer."""
    for layer, typed in enumerate(views):
        view = typed.view(torch.uint8)  # bytes: random bf16 holds NaNs, which equal nothing
        src = torch.tensor(a.ids_by_layer[layer], device=view.device)
        dst = torch.tensor(b.ids_by_layer[layer], device=view.device)
        if not torch.equal(view.index_select(0, src), view.index_select(0, dst)):
            return False
    return True


def _tier_url(kind: str, directory: Path, chunk_bytes: int, chunks: int) -> str:
    size = 2 * chunk_bytes * chunks + (64 << 20)
    if kind == "memory":
        return f"memory://?size={size}&pin=0"
    return f"{kind}://{directory / kind}?size={size}"


def gds_status(device: torch.device | None = None) -> dict[str, Any]:
    """Whether GPUDirect Storage is usable here (through kvikio) and in which mode."""
    if device is not None and device.type != "cuda":
        return {"available": False, "reason": "the KV is in host memory (no GPU to read into)"}
    try:
        require_gds()
    except ConfigError as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True, "compat_mode": compat_mode()}


def run_transfer_bench(
    config: TransferBenchConfig, on_step: Callable[[str], None] = lambda _: None
) -> TransferReport:
    """Run every measurement of ``config`` (see the module docstring)."""
    device = _device(config.device)
    shape = config.shape()
    on_step(f"building a {shape.nbytes / 2**30:.2f} GiB {config.layout} pool on {device}")
    _raw, views = paged_kv(shape, config.layout, str(device), config.seed)
    engine = open_transfer_engine(
        views, config.block_size, config.chunk_tokens, config.ring_bytes, config.chunks + 4
    )
    try:
        report = TransferReport(
            config={
                **asdict(config),
                "directory": str(config.directory or ""),
                "tiers": list(config.tiers),
            },
            device_name=_device_name(device),
            chunk_bytes=engine.chunk_bytes,
            gds=gds_status(device),
        )
        report.config["pool_bytes"] = shape.nbytes
        src = _placements(config, shape.layers, 1)
        dst = _placements(config, shape.layers, 1 + len(src) * src[0].count)
        _round_trips(config, engine, views, src, dst, report, on_step)
        _copies(config, engine, device, src, dst, report, on_step)
        _overlap(config, engine, device, views, src, dst, report, on_step)
        _file_io(config, engine, device, src, report, on_step)
        return report
    finally:
        engine.close()


def _device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    from kvtier.engines.transfer.cuda import require_cuda

    return require_cuda(name)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return cpu_description()


def _round_trips(config, engine, views, src, dst, report, on_step) -> None:
    """Each tier: gather, store, read back, scatter elsewhere, compare."""
    with tempfile.TemporaryDirectory(dir=config.directory) as tmp:
        for kind in config.tiers:
            on_step(f"round trip through {kind}")
            tier = open_tier(_tier_url(kind, Path(tmp), engine.chunk_bytes, len(src)), b"t" * 16)
            try:
                began = time.perf_counter()
                ok, stored, read = True, 0, 0
                for i in range(0, len(src), 8):
                    part_src, part_dst = src[i : i + 8], dst[i : i + 8]
                    bufs = engine.take_buffers(len(part_src))
                    try:
                        part_src, part_dst = part_src[: len(bufs)], part_dst[: len(bufs)]
                        engine.to_host(part_src, bufs)
                        keys = [(i + j).to_bytes(16, "little") for j in range(len(bufs))]
                        stored += sum(
                            tier.put(k, b, BlockMeta(dtype="bf16"))
                            for k, b in zip(keys, bufs, strict=True)
                        )
                        for buf in bufs:
                            buf[:] = 0
                        read += sum(
                            tier.get_into(k, b) is not None for k, b in zip(keys, bufs, strict=True)
                        )
                        engine.to_device(part_dst, bufs)
                    finally:
                        engine.give_buffers(bufs)
                    ok = ok and all(
                        _same_blocks(views, a, b) for a, b in zip(part_src, part_dst, strict=True)
                    )
                seconds = time.perf_counter() - began
            finally:
                tier.close()
            report.round_trips.append(
                {"tier": kind, "chunks": len(src), "stored": stored, "read": read,
                 "exact": bool(ok and stored == read == len(src)), "seconds": seconds}
            )  # fmt: skip


def _copies(config, engine, device, src, dst, report, on_step) -> None:
    """The engine's gather and scatter against a plain copy of the same bytes."""
    bufs = engine.take_buffers(len(src))
    n = len(bufs)
    nbytes = n * engine.chunk_bytes
    try:
        on_step(f"copies: {n} chunks, {nbytes / 2**20:.0f} MiB each way")
        if device.type == "cuda":
            dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

            def plain_out() -> None:
                host.copy_(dev, non_blocking=True)

            def plain_in() -> None:
                dev.copy_(host, non_blocking=True)
        else:
            a = np.ones(nbytes, np.uint8)
            b = np.empty(nbytes, np.uint8)

            def plain_out() -> None:
                np.copyto(b, a)

            plain_in = plain_out
        r = config.repeats

        def timed(move: Callable[[], None], plain: Callable[[], None]) -> tuple[float, float]:
            return _best(move, device, r), _best(plain, device, r)

        measured = {
            "to_host": timed(lambda: engine.to_host(src[:n], bufs), plain_out),
            "to_device": timed(lambda: engine.to_device(dst[:n], bufs), plain_in),
            "to_device_layerwise": timed(
                lambda: engine.to_device(dst[:n], bufs, layerwise=True), plain_in
            ),
        }  # fmt: skip
    finally:
        engine.give_buffers(bufs)
    for name, (eng_s, ref_s) in measured.items():
        report.copies[name] = {
            "bytes": nbytes,
            "engine_gbps": nbytes / eng_s / 1e9,
            "plain_gbps": nbytes / ref_s / 1e9,
            "share_of_plain": ref_s / eng_s,
        }


def _forward(device: torch.device, layers: int, hidden: int, tokens: int):
    """A stand-in forward: per layer, four matmuls of ``[tokens, hidden] × [hidden, hidden]``;
    ``wait(layer)`` is called before each layer's. Returns the function and per-layer times."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w = torch.randn(hidden, hidden, device=device, dtype=dtype) / hidden**0.5

    def run(wait: Callable[[int], None] = lambda _: None, marks: list | None = None) -> None:
        y = x
        for layer in range(layers):
            wait(layer)
            if marks is not None:
                marks.append(_stamp(device))
            for _ in range(4):
                y = torch.tanh(y @ w)

    return run


def _stamp(device: torch.device):
    """A point in time on the compute stream (a CUDA event) or the host clock."""
    if device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def _since(start, mark, device: torch.device) -> float:
    if device.type == "cuda":
        return float(start.elapsed_time(mark)) / 1e3
    return float(mark - start)


def _overlap(config, engine, device, views, src, dst, report, on_step) -> None:
    """The stand-in forward alone, beside a full load, and waiting for it layer by layer."""
    layers = len(views)
    bufs = engine.take_buffers(len(src))
    n = len(bufs)
    try:
        engine.to_host(src[:n], bufs)
        load_s = _best(lambda: engine.to_device(dst[:n], bufs, layerwise=True), device, 3)
        spec = get_model(config.model)
        hidden = spec.attention_heads * spec.head_dim if device.type == "cuda" else 256
        per_layer = load_s / layers
        tokens = 64
        on_step("sizing the stand-in forward to the load")
        while tokens < 1 << 16:
            one = _best(_forward(device, 1, hidden, tokens), device, 3)
            if one >= per_layer:
                break
            tokens *= 2
        forward = _forward(device, layers, hidden, tokens)
        alone = _best(forward, device, config.repeats)

        on_step("forward beside a full load")
        beside = []
        for _ in range(config.repeats):
            loader = threading.Thread(
                target=engine.to_device, args=(dst[:n], bufs), kwargs={"layerwise": True}
            )
            _sync(device)
            began = time.perf_counter()
            loader.start()
            forward()
            _sync(device)
            beside.append(time.perf_counter() - began)
            loader.join()

        on_step("forward waiting layer by layer")
        firsts, lasts, totals_layer, totals_whole = [], [], [], []
        for _ in range(config.repeats):
            for layerwise in (True, False):
                progress = LoadProgress(layers)
                marks: list = []
                _sync(device)
                start = _stamp(device)
                began = time.perf_counter()
                loader = threading.Thread(
                    target=engine.to_device,
                    args=(dst[:n], bufs, progress),
                    kwargs={"layerwise": layerwise},
                )
                loader.start()
                if layerwise:
                    forward(progress.wait_layer, marks)
                else:
                    progress.wait()
                    forward()
                _sync(device)
                total = time.perf_counter() - began
                loader.join()
                if layerwise:
                    firsts.append(_since(start, marks[0], device))
                    lasts.append(_since(start, marks[-1], device))
                    totals_layer.append(total)
                else:
                    totals_whole.append(total)
    finally:
        engine.give_buffers(bufs)
    med = statistics.median
    report.overlap = {
        "chunks": n,
        "load_s": load_s,
        "stand_in_tokens": tokens,
        "stand_in_hidden": hidden,
        "forward_alone_s": alone,
        "forward_beside_load_s": med(beside),
        "slowdown": med(beside) / alone - 1,
        "first_layer_usable_s": med(firsts),
        "last_layer_usable_s": med(lasts),
        "total_layerwise_s": med(totals_layer),
        "total_whole_s": med(totals_whole),
    }


def _device_io(device: torch.device, gds: dict[str, Any]) -> DeviceFileIO | None:
    """What moves bytes straight between files and the KV's memory here (None: nothing)."""
    if device.type == "cpu":
        return PosixFileIO()
    return KvikioFileIO() if gds.get("available") else None


def _file_io(config, engine, device, src, report, on_step) -> None:
    """Chunks written to and read from a ``file://`` tier through host memory (staged) and
    straight between the file and the KV's memory (the tier's device verbs)."""
    io = _device_io(device, report.gds)
    if io is None:
        report.file_io = {"skipped": report.gds["reason"]}
        return
    bufs = engine.take_buffers(len(src))
    n = len(bufs)
    nbytes = n * engine.chunk_bytes
    meta = BlockMeta(dtype="bf16")
    try:
        engine.to_host(src[:n], bufs)
        hosts = [torch.from_numpy(np.asarray(b).view(np.uint8)) for b in bufs]
        chunks = [h.to(device, copy=True) for h in hosts]
        outs = [torch.empty_like(c) for c in chunks]
        with tempfile.TemporaryDirectory(dir=config.directory) as tmp:
            size = 2 * nbytes + (64 << 20)
            tier = DiskTier(b"g" * 16, Path(tmp), size, codec="raw", device_io=io)
            try:
                on_step(f"file reads and writes, staged and straight ({io.name})")
                keys = [i.to_bytes(16, "little") for i in range(n)]

                def write_staged() -> None:
                    for h, c in zip(hosts, chunks, strict=True):
                        h.copy_(c)
                    tier.put_many([(k, b, meta) for k, b in zip(keys, bufs, strict=True)])

                def write_straight() -> None:
                    tier.write_device([(k, c, meta) for k, c in zip(keys, chunks, strict=True)])

                def read_staged() -> None:
                    tier.get_many_into(keys, bufs)
                    for h, o in zip(hosts, outs, strict=True):
                        o.copy_(h)

                def read_straight() -> None:
                    tier.read_device(keys, outs)

                r = config.repeats
                w_staged, w_straight = (
                    _best(write_staged, device, r),
                    _best(write_straight, device, r),
                )
                r_staged = _best(read_staged, device, r)
                exact_staged = all(torch.equal(o, c) for o, c in zip(outs, chunks, strict=True))
                for o in outs:
                    o.zero_()
                r_straight = _best(read_straight, device, r)
                exact_straight = all(torch.equal(o, c) for o, c in zip(outs, chunks, strict=True))
                direct = tier.direct
            finally:
                tier.close()
    finally:
        engine.give_buffers(bufs)
    report.file_io = {
        **io.describe(),
        "chunks": n,
        "bytes": nbytes,
        "tier_o_direct": direct,
        "write_staged_gbps": nbytes / w_staged / 1e9,
        "write_straight_gbps": nbytes / w_straight / 1e9,
        "read_staged_gbps": nbytes / r_staged / 1e9,
        "read_straight_gbps": nbytes / r_straight / 1e9,
        "exact": bool(exact_staged and exact_straight),
    }


__all__ = ["TIERS", "TransferBenchConfig", "TransferReport", "gds_status", "run_transfer_bench"]
