"""``kvtier bench codec``: lossless codecs on real and synthetic KV, in one run.

Corpora: real KV of the embedded model (prompts of several kinds × lengths, bf16 and fp16, in
256-token chunks as the tiers store them: :mod:`kvtier.engines.kv_corpus`), synthetic bf16
tensors with per-channel scales, random bytes, and uniform fp16 noise (MLPerf's synthetic KV).
Methods: ``raw`` (a copy), zstd at several levels, ``byteplane+zstd`` (the two bytes of each
element in two planes, zstd-1 each), ``zipnn`` (when installed) and kvtier's ``kv`` codec. Ratio is
total raw bytes / total stored bytes over a corpus; speeds are raw bytes per second, on one
thread ("per core") and on a thread per core over the corpus's blocks ("all cores").

Decoding goes where each method's API can put it. ``raw`` and ``kv`` write into a buffer the
caller names, as the tiers do (a read decodes into the destination it was given): into one
buffer per block, allocated and touched before the clock starts. zstd, ``byteplane+zstd`` and
zipnn return buffers of their own (zipnn's API takes no destination), whose allocation is part
of their time, and their output is taken as it comes, without a copy.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from kvtier.codec import get_codec
from kvtier.codec.zstd_frames import zstd_compress, zstd_decompress
from kvtier.errors import ConfigError, MissingExtraError
from kvtier.specs.host import cpu_model

Encode = Callable[[memoryview, str, tuple[int, ...]], bytes]
Decode = Callable[[bytes, int, str, tuple[int, ...]], bytes | bytearray | np.ndarray]
DecodeInto = Callable[[bytes, np.ndarray, str], None]


@dataclass(frozen=True)
class Block:
    """One block of a corpus: its bytes, element dtype and shape."""

    data: np.ndarray  # uint8
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Method:
    """A codec under test: encode a block, decode it back (sizes known to the caller); ``into``,
    where the method can, decodes into a buffer of the block's size instead."""

    name: str
    encode: Encode
    decode: Decode
    into: DecodeInto | None = None


@dataclass
class Result:
    """One method on one corpus."""

    corpus: str
    method: str
    raw_bytes: int
    stored_bytes: int
    ratio: float
    encode_gbps_core: float
    decode_gbps_core: float
    encode_gbps_all: float
    decode_gbps_all: float
    exact: bool


@dataclass(frozen=True)
class CodecBenchConfig:
    """What ``kvtier bench codec`` measures."""

    dtypes: tuple[str, ...] = ("bf16", "fp16")
    kinds: tuple[str, ...] = ("prose", "code", "table", "chat")
    lengths: tuple[int, ...] = (1024, 4096)
    per_prompt: int = 1
    zstd_levels: tuple[int, ...] = (1, 3)
    synthetic_blocks: int = 4
    real: bool = True
    repeats: int = 2
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ConfigError(f"threads must be at least 1, got {self.threads}")
        if any(not -5 <= lv <= 22 for lv in self.zstd_levels):
            raise ConfigError(f"zstd levels go from -5 to 22, got {self.zstd_levels}")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be at least 1, got {self.repeats}")
        if self.synthetic_blocks < 0:
            raise ConfigError("synthetic blocks must be 0 or more")


@dataclass
class CodecReport:
    """All results of one run, and the machine it ran on."""

    config: dict
    cpu: str
    cores: int
    results: list[Result]
    load: tuple[float, float, float]


# --- methods -----------------------------------------------------------------------------------
def _zstd(level: int) -> Method:
    return Method(
        f"zstd-{level}",
        lambda raw, dtype, shape: zstd_compress(raw, level),
        lambda stored, n, dtype, shape: zstd_decompress(stored, n),
    )


def _byteplane_encode(raw: memoryview, dtype: str, shape: tuple[int, ...]) -> bytes:
    a = np.frombuffer(raw, np.uint8)
    n = a.size // 2
    hi = zstd_compress(np.ascontiguousarray(a[1 : 2 * n : 2]))
    lo = zstd_compress(np.ascontiguousarray(a[0 : 2 * n : 2]))
    return len(hi).to_bytes(8, "little") + hi + lo + a[2 * n :].tobytes()


def _byteplane_decode(stored: bytes, size: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    n = size // 2
    k = int.from_bytes(stored[:8], "little")
    out = np.empty(size, np.uint8)
    view = memoryview(stored)
    out[1 : 2 * n : 2] = np.frombuffer(zstd_decompress(view[8 : 8 + k], n), np.uint8)
    tail = size - 2 * n
    lo_end = len(stored) - tail
    out[0 : 2 * n : 2] = np.frombuffer(zstd_decompress(view[8 + k : lo_end], n), np.uint8)
    out[2 * n :] = np.frombuffer(view[lo_end:], np.uint8)
    return out


def _kvtier() -> Method:
    codec = get_codec("kv")

    def encode(raw: memoryview, dtype: str, shape: tuple[int, ...]) -> bytes:
        stored = codec.encode(raw, dtype, shape)
        return b"\x00" + bytes(raw) if stored is None else b"\x01" + bytes(stored)

    def into(stored: bytes, out: np.ndarray, dtype: str) -> None:
        if stored[0] == 0:  # stored raw, as the container does when the codec declines
            out[:] = np.frombuffer(stored, np.uint8, offset=1)
        else:
            codec.decode_into(memoryview(stored)[1:], memoryview(out), dtype)

    def decode(stored: bytes, size: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(size, np.uint8)
        into(stored, out, dtype)
        return out

    return Method("kvtier-kv", encode, decode, into)


def _zipnn() -> Method:
    try:
        import zipnn
    except ImportError:
        raise MissingExtraError("the zipnn comparison", "bench", "zipnn") from None
    names = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

    def coder(dtype: str):
        return zipnn.ZipNN(
            input_format="byte", bytearray_dtype=names.get(dtype, "bfloat16"), threads=1
        )

    def encode(raw: memoryview, dtype: str, shape: tuple[int, ...]) -> bytes:
        return bytes(coder(dtype).compress(bytes(raw)))

    def decode(stored: bytes, size: int, dtype: str, shape: tuple[int, ...]) -> bytearray:
        return coder(dtype).decompress(stored)

    return Method("zipnn", encode, decode)


def methods(levels: Sequence[int], with_zipnn: bool | None = None) -> list[Method]:
    """The methods of a run: raw, zstd levels, byteplane+zstd, zipnn (when installed), kv."""
    out = [
        Method(
            "raw",
            lambda raw, d, s: bytes(raw),
            lambda stored, n, d, s: bytearray(stored),
            lambda stored, out, d: np.copyto(out, np.frombuffer(stored, np.uint8)),
        ),
        *(_zstd(lv) for lv in levels),
        Method("byteplane+zstd-1", _byteplane_encode, _byteplane_decode),
    ]
    if with_zipnn is None:
        with contextlib.suppress(MissingExtraError):
            out.append(_zipnn())
    elif with_zipnn:
        out.append(_zipnn())
    out.append(_kvtier())
    return out


# --- corpora -----------------------------------------------------------------------------------
SYNTH_SHAPE = (30, 2, 3, 256, 64)


def synthetic_corpora(
    blocks: int, seed: int = 0, shape: tuple[int, ...] = SYNTH_SHAPE
) -> dict[str, list[Block]]:
    """Synthetic bf16 with per-channel scales, random bytes, uniform fp16 noise in [-1, 1)."""
    rng = np.random.default_rng(seed)
    synth, rand, uniform = [], [], []
    for _ in range(blocks):
        scale = np.exp2(rng.integers(-6, 3, size=(*shape[:-2], 1, shape[-1])))
        x = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
        bf = (x.view(np.uint32) >> 16).astype(np.uint16)
        synth.append(Block(bf.view(np.uint8).ravel(), "bf16", shape))
        rand.append(Block(rng.integers(0, 256, bf.nbytes, dtype=np.uint8), "bf16", shape))
        u = rng.uniform(-1, 1, size=shape).astype(np.float16)
        uniform.append(Block(u.view(np.uint8).ravel(), "fp16", shape))
    return {"synthetic-bf16": synth, "random-bytes": rand, "uniform-fp16": uniform}


def real_corpora(config: CodecBenchConfig, progress=None) -> dict[str, list[Block]]:
    """Real KV of the embedded model, one corpus per dtype (see :mod:`kvtier.engines.kv_corpus`)."""
    from kvtier.engines.kv_corpus import load_corpus

    items = load_corpus(
        config.dtypes, config.kinds, config.lengths, config.per_prompt, progress=progress
    )
    out: dict[str, list[Block]] = {}
    for item in items:
        for chunk in item.chunks:
            block = Block(chunk.view(np.uint8).ravel(), item.dtype, item.shape)
            out.setdefault(f"real-{item.dtype}", []).append(block)
    return out


# --- measuring ---------------------------------------------------------------------------------
def _timed(fn, args: list, pool: ThreadPoolExecutor | None, repeats: int = 1) -> tuple[list, float]:
    """``fn`` over ``args`` (on ``pool`` when given): the results and the best of ``repeats``
    passes' seconds (the least disturbed by other work on a shared machine)."""
    best = float("inf")
    out: list = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = list(pool.map(fn, args)) if pool is not None else [fn(a) for a in args]
        best = min(best, time.perf_counter() - start)
    return out, best


def measure(
    corpus: str, blocks: list[Block], method: Method, threads: int, repeats: int = 2
) -> Result:
    """Ratio and speeds of ``method`` over ``blocks`` (see :func:`measure_all`)."""
    return measure_all(corpus, blocks, [method], threads, repeats)[0]


def measure_all(
    corpus: str, blocks: list[Block], methods: Sequence[Method], threads: int, repeats: int = 2
) -> list[Result]:
    """Ratio and speeds of each of ``methods`` over ``blocks``; checks every block comes back
    exact.

    Each speed is the best of ``repeats`` passes, the methods' passes taken in turn (one pass
    of each, then the next round), so a burst of other work on a shared machine slows every
    method's passes alike instead of one method's all; the first round also warms them up."""
    raw = sum(b.data.nbytes for b in blocks)

    def coder(method: Method):
        def enc(b: Block) -> bytes:
            return method.encode(memoryview(b.data), b.dtype, b.shape)

        def dec(item: tuple[Block, bytes, np.ndarray | None]):
            b, stored, dest = item
            if dest is None:
                return method.decode(stored, b.data.nbytes, b.dtype, b.shape)
            method.into(stored, dest, b.dtype)
            return dest

        return enc, dec

    coders = [coder(m) for m in methods]
    # the destinations of the methods that decode into one: allocated and touched up front
    dests = [
        [np.ones(b.data.nbytes, np.uint8) for b in blocks] if m.into else [None] * len(blocks)
        for m in methods
    ]
    stored: list[list[bytes]] = []
    exact: list[bool] = []
    for k, (enc, dec) in enumerate(coders):
        got = [enc(b) for b in blocks]
        back = [dec(p) for p in zip(blocks, got, dests[k], strict=True)]
        exact.append(
            all(
                np.array_equal(np.frombuffer(memoryview(o).cast("B"), np.uint8), b.data)
                for o, b in zip(back, blocks, strict=True)
            )
        )
        del back
        stored.append(got)
    best = [[float("inf")] * 4 for _ in methods]
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            for k, (enc, dec) in enumerate(coders):
                pairs = list(zip(blocks, stored[k], dests[k], strict=True))
                for j, (fn, args, on) in enumerate(
                    (
                        (enc, blocks, None),
                        (dec, pairs, None),
                        (enc, blocks, pool),
                        (dec, pairs, pool),
                    )
                ):
                    best[k][j] = min(best[k][j], _timed(fn, args, on)[1])
    out = []
    for k, method in enumerate(methods):
        total = sum(len(s) for s in stored[k])
        t_enc, t_dec, t_enc_all, t_dec_all = best[k]
        out.append(
            Result(
                corpus,
                method.name,
                raw,
                total,
                raw / total if total else 0.0,
                raw / t_enc / 1e9,
                raw / t_dec / 1e9,
                raw / t_enc_all / 1e9,
                raw / t_dec_all / 1e9,
                exact[k],
            )
        )
    return out


def run_codec_bench(
    config: CodecBenchConfig,
    on_step: Callable[[str], None] | None = None,
    with_zipnn: bool | None = None,
) -> CodecReport:
    """Every method on every corpus, one run."""
    corpora: dict[str, list[Block]] = {}
    if config.real:
        corpora.update(real_corpora(config, on_step))
    if config.synthetic_blocks:
        corpora.update(synthetic_corpora(config.synthetic_blocks))
    results = []
    for name, blocks in corpora.items():
        run = methods(config.zstd_levels, with_zipnn)
        if on_step:
            on_step(f"{len(run)} methods on {name}")
        results.extend(measure_all(name, blocks, run, config.threads, config.repeats))
    return CodecReport(asdict(config), cpu_model(), os.cpu_count() or 1, results, os.getloadavg())


def steps(config: CodecBenchConfig) -> int:
    """Progress steps of a run, one per corpus (an estimate: corpus building adds some)."""
    return (len(config.dtypes) if config.real else 0) + (3 if config.synthetic_blocks else 0)


__all__ = [
    "Block",
    "CodecBenchConfig",
    "CodecReport",
    "Method",
    "Result",
    "measure",
    "measure_all",
    "methods",
    "real_corpora",
    "run_codec_bench",
    "steps",
    "synthetic_corpora",
]
