"""``kvtier bench peers``: the same KV stored, looked up and retrieved through kvtier's tiers, the
peers users choose instead (LMCache's local CPU, local disk and Redis backends; Mooncake Store's
own client) and the raw floor of each medium (a copy, fio, redis-py, Mooncake's raw get), in one
run, the systems taking turns.

Per system, three phases, each round visiting every system in an order that turns by one each
round (so drift on a shared machine falls on all alike):

- ``chunk``: a one-chunk prompt (real KV of the embedded model, or synthetic of ``--model``'s
  geometry) stored, then retrieved: the latency of each, per round. A store lasts until a fresh
  lookup finds every chunk. Systems that read through the page cache (LMCache's disk, and
  ``slab://`` where O_DIRECT is refused) read cold first (their files' cache dropped) and then
  warm. After the last round, each system's bytes held for those chunks give bytes per token.
- ``prefix``: a 32k-token prompt of synthetic KV in the embedded model's geometry (its own
  context is 8k) the same way, plus the lookup that finds it.
- ``throughput``: ``requests`` one-chunk prompts stored by 1, 4 and 16 threads at once (until a
  lookup finds all), then retrieved the same way: chunks and bytes per second, the median of
  ``throughput_rounds`` rounds (such a pass is short, and a shared machine's speed drifts).

Every retrieved chunk is compared with what was stored, byte for byte. A system that fails
(a lost or wrong chunk, an error) is reported with one line and left out of later phases.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kvtier.bench.driver import PassPlan, run_pass
from kvtier.bench.peers_systems import (
    HOST_MEMORY,
    LOCAL_DISK,
    REDIS,
    CopyReference,
    Geometry,
    KvtierSystem,
    PeersError,
    Prompt,
    RedisReference,
    System,
    bad_chunks,
)
from kvtier.bench.stats import LatencyStats
from kvtier.errors import ConfigError, KvtierError
from kvtier.specs import MiB, get_model
from kvtier.specs.model import dtype_bytes

EMBEDDED = "smollm2-135m"
PAYLOADS = ("real", "synthetic")
VOCAB = 49152
POOL = 8  # distinct synthetic chunks
#: Ops whose latency each round records, per phase.
LATENCY_OPS = ("store", "lookup", "retrieve", "retrieve_warm")
StepCallback = Callable[[str], None]
#: How the bench runs LMCache 0.5.6, said in every report that measures it.
LMCACHE_NOTES = [
    "slab:// writes with O_DIRECT and O_DSYNC (a stored chunk is on the device); LMCache's "
    "local disk writes through the page cache without fsync (a stored chunk may be in memory "
    "only), and its warm reads come from the page cache",
    "LMCache 0.5.6 workarounds in the bench: its local disk's count of bytes held is set again "
    "after removals (LocalDiskBackend.remove leaves it, and new puts are then dropped); its Redis "
    "backend removes nothing (remove_sync raises NotImplementedError), so its server, which "
    "holds only its objects, is flushed between rounds; its Redis connector is closed around a "
    "hang in its own close",
]


@dataclass(frozen=True)
class MooncakeAddress:
    """Where the bench's Mooncake Store master answers (started on loopback by the command)."""

    master: str  # host:rpc_port
    metadata: str  # http://host:port/metadata
    url: str = ""  # the kvtier tier's URL over it (empty: no mooncake:// tier to measure)


@dataclass(frozen=True)
class PeersConfig:
    """What ``kvtier bench peers`` measures, and where (servers the command started)."""

    directory: Path
    model: str = EMBEDDED
    payload: str = "real"
    chunk_rounds: int = 12
    prefix_tokens: int = 32768
    prefix_rounds: int = 4
    requests: int = 64
    throughput_rounds: int = 3
    depths: tuple[int, ...] = (1, 4, 16)
    chunk_tokens: int = 256
    redis: dict[str, str] = field(default_factory=dict)  # "kvtier", "lmcache", "reference"
    mooncake: MooncakeAddress | None = None
    lmcache: bool = True
    fio: bool = True
    raw_twins: bool = False
    timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.payload not in PAYLOADS:
            raise ConfigError(f"--payload is one of {', '.join(PAYLOADS)}, got {self.payload!r}")
        if self.payload == "real" and (self.model != EMBEDDED or self.chunk_tokens != 256):
            raise ConfigError(
                f"--payload real is the embedded model's KV ({EMBEDDED}, 256-token chunks); "
                "use --payload synthetic for another --model"
            )
        for name in ("chunk_rounds", "prefix_rounds", "requests", "throughput_rounds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.prefix_tokens < self.chunk_tokens or self.prefix_tokens % self.chunk_tokens:
            raise ConfigError(
                f"--prefix-tokens must be a whole number of {self.chunk_tokens}-token chunks, "
                f"got {self.prefix_tokens}"
            )
        if not self.depths or min(self.depths) < 1:
            raise ConfigError(f"depths must be positive integers, got {self.depths}")
        get_model(self.model)  # an unknown model is refused here, in one line

    @property
    def geometry(self) -> Geometry:
        """The KV geometry the chunks have."""
        spec = get_model(self.model)
        return Geometry(
            spec.name,
            spec.layers,
            spec.kv_heads,
            spec.head_dim,
            spec.kv_dtype,
            int(dtype_bytes(spec.kv_dtype)),
            self.chunk_tokens,
        )

    @property
    def prefix_chunks(self) -> int:
        """Chunks of the long prefix."""
        return self.prefix_tokens // self.chunk_tokens

    @property
    def room_bytes(self) -> int:
        """What a store must hold at once: the larger phase, with room for headers and slack."""
        geo = self.geometry
        chunks = max(self.prefix_chunks, self.requests, self.chunk_rounds)
        return int(chunks * geo.chunk_bytes * 1.25) + 64 * MiB

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            **asdict(self),
            "directory": str(self.directory),
            "depths": list(self.depths),
            "geometry": self.geometry.as_dict(),
        }


@dataclass
class SystemResult:
    """What one system did: latency per phase and op, throughput per depth, bytes per token."""

    name: str
    tier_class: str
    side: str
    detail: str
    latency: dict[str, dict[str, LatencyStats]] = field(default_factory=dict)  # phase → op
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    throughput: list[dict] = field(default_factory=list)  # depth, op, chunks, bytes, seconds
    passes: dict[tuple[int, str], list[float]] = field(default_factory=dict)  # seconds per pass
    bytes_per_token: float | None = None  # as stored, on the chunk phase's KV
    codec_bytes_per_token: dict[str, float] = field(default_factory=dict)  # kvtier: per codec
    chunks_checked: int = 0
    wrong_chunks: int = 0
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def add_sample(self, phase: str, op: str, seconds: float) -> None:
        """Record one request's seconds."""
        self.samples.setdefault(phase, {}).setdefault(op, []).append(seconds)

    def add_pass(self, depth: int, op: str, seconds: float) -> None:
        """Record one throughput pass's seconds."""
        self.passes.setdefault((depth, op), []).append(seconds)

    def summarize(self, chunks: int, chunk_bytes: int) -> None:
        """Latency stats from the samples (fio's come as stats already); per depth and op, the
        pass of median rate out of the rounds (every round's rate kept beside it)."""
        for phase, ops in self.samples.items():
            for op, values in ops.items():
                self.latency.setdefault(phase, {})[op] = LatencyStats.from_samples(values)
        nbytes = chunks * chunk_bytes
        self.throughput = []
        for (depth, op), seconds in self.passes.items():
            ranked = sorted(seconds)
            mid = ranked[len(ranked) // 2]  # the median (the slower middle one of an even count)
            self.throughput.append(
                {
                    "depth": depth,
                    "op": op,
                    "chunks": chunks,
                    "bytes": nbytes,
                    "seconds": mid,
                    "chunks_per_s": chunks / mid if mid > 0 else 0.0,
                    "gbps": nbytes / mid / 1e9 if mid > 0 else 0.0,
                    "rounds_gbps": [nbytes / x / 1e9 if x > 0 else 0.0 for x in seconds],
                }
            )

    def rate(self, depth: int, op: str) -> dict | None:
        """The throughput row of ``op`` at ``depth`` (None where not measured)."""
        return next((t for t in self.throughput if t["depth"] == depth and t["op"] == op), None)

    def as_dict(self) -> dict:
        """Plain JSON-ready dict (latencies in seconds)."""
        return {
            "name": self.name,
            "tier_class": self.tier_class,
            "side": self.side,
            "detail": self.detail,
            "latency_s": {
                phase: {op: stats.as_dict() for op, stats in ops.items()}
                for phase, ops in self.latency.items()
            },
            "throughput": self.throughput,
            "bytes_per_token": self.bytes_per_token,
            "codec_bytes_per_token": self.codec_bytes_per_token,
            "chunks_checked": self.chunks_checked,
            "wrong_chunks": self.wrong_chunks,
            "exact": None if self.chunks_checked == 0 else self.wrong_chunks == 0,
            "error": self.error,
            "notes": self.notes,
        }


@dataclass
class PeersReport:
    """One run: the config, every system's result, what could not run and why."""

    config: PeersConfig
    results: list[SystemResult] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)  # system or peer → one line
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def result(self, name: str) -> SystemResult | None:
        """The result of the system called ``name``."""
        return next((r for r in self.results if r.name == name), None)


# --- the KV ------------------------------------------------------------------------------------
def synthetic_chunks(geo: Geometry, count: int, seed: int) -> list[np.ndarray]:
    """``count`` chunks of synthetic KV in ``geo``'s dtype: normal values with a scale per
    (layer, K/V, head, channel), as real KV has, as raw bytes."""
    rng = np.random.default_rng(seed)
    shape = geo.chunk_shape
    out = []
    for _ in range(count):
        scale = np.exp2(rng.integers(-6, 3, size=(*shape[:-2], 1, shape[-1])))
        x = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
        if geo.dtype == "bf16":
            bits = (x.view(np.uint32) >> 16).astype(np.uint16)
        elif geo.dtype == "fp16":
            bits = x.astype(np.float16)
        else:
            bits = x
        out.append(np.ascontiguousarray(bits).view(np.uint8).ravel())
    return out


def real_chunks(geo: Geometry, progress: StepCallback | None = None) -> list[np.ndarray]:
    """Real KV chunks of the embedded model (four prompt kinds × four chunks), computed once and
    kept by :mod:`kvtier.engines.kv_corpus`."""
    from kvtier.engines.kv_corpus import load_corpus

    corpus = load_corpus(dtypes=(geo.dtype,), lengths=(1024,), per_prompt=4, progress=progress)
    chunks = [
        np.ascontiguousarray(c).view(np.uint8).ravel() for item in corpus for c in item.chunks
    ]
    if not chunks or chunks[0].nbytes != geo.chunk_bytes:
        raise ConfigError("the KV corpus's chunks are not this model's chunks")
    return chunks


class PromptMaker:
    """Fresh prompts: new token ids each time (so every store is new to every system), KV from
    a pool of chunks (one chunk each) or the long prefix's buffer."""

    def __init__(self, config: PeersConfig, pool: list[np.ndarray], torch_tokens: bool):
        self.config = config
        self.pool = pool
        self.torch_tokens = torch_tokens
        self.rng = np.random.default_rng(config.seed)
        self.count = 0
        geo = config.geometry
        synth = synthetic_chunks(geo, POOL, config.seed + 1)
        self.prefix_kv = np.empty(config.prefix_chunks * geo.chunk_bytes, dtype=np.uint8)
        for i in range(config.prefix_chunks):
            self.prefix_kv[i * geo.chunk_bytes : (i + 1) * geo.chunk_bytes] = synth[i % POOL]

    def _prompt(self, kv: np.ndarray) -> Prompt:
        n = kv.nbytes // self.config.geometry.bytes_per_token
        tokens = self.rng.integers(0, VOCAB, size=n, dtype=np.uint32)
        self.count += 1
        prompt = Prompt(self.count, tokens, kv, self.config.chunk_tokens)
        if self.torch_tokens:
            import torch

            prompt.torch_tokens = torch.from_numpy(tokens.astype(np.int64))
        return prompt

    def chunk(self, k: int) -> Prompt:
        """A one-chunk prompt of the pool's chunk ``k`` (modulo its size)."""
        return self._prompt(self.pool[k % len(self.pool)])

    def prefix(self) -> Prompt:
        """A long prompt over the prefix's KV."""
        return self._prompt(self.prefix_kv)


# --- the run -----------------------------------------------------------------------------------
def turned(items: Sequence, k: int) -> list:
    """``items`` starting at position ``k`` (modulo), wrapping around."""
    if not items:
        return []
    k %= len(items)
    return [*items[k:], *items[:k]]


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:240] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PeersBench:
    """Runs the comparison; ``on_step`` hears each finished step (for a progress bar)."""

    def __init__(self, config: PeersConfig, on_step: StepCallback | None = None):
        self.config = config
        self.on_step = on_step or (lambda _label: None)
        self.systems: list[System] = []
        self.results: dict[str, SystemResult] = {}
        self.fio = None
        self.report = PeersReport(config)
        self.maker: PromptMaker | None = None
        self.chunk_out = np.empty(0, dtype=np.uint8)
        self.prefix_out = np.empty(0, dtype=np.uint8)
        self.request_outs: list[np.ndarray] = []

    # --- set-up -------------------------------------------------------------------------------
    def steps(self) -> int:
        """Steps ``run`` reports: rounds of the two latency phases and one per depth, plus
        set-up, warm-up and the capacity count."""
        cfg = self.config
        return 3 + cfg.chunk_rounds + cfg.prefix_rounds + len(cfg.depths)

    def kvtier_urls(self) -> list[tuple[str, str, str, Path | None]]:
        """(name, tier class, URL, page-cached folder) of each kvtier system."""
        cfg = self.config
        room = f"{-(-cfg.room_bytes // MiB)}MiB"
        disk = cfg.directory / "kvtier-slab"
        out: list[tuple[str, str, str, Path | None]] = [
            ("kvtier memory://", HOST_MEMORY, f"memory://?size={room}", None),
            ("kvtier slab://", LOCAL_DISK, f"slab://{disk}?size={room}", None),
        ]
        if "kvtier" in cfg.redis:
            url = f"{cfg.redis['kvtier']}?timeout=30&name=redis"
            out.append(("kvtier redis://", REDIS, url, None))
        if cfg.mooncake is not None and cfg.mooncake.url:
            out.append(("kvtier mooncake://", "mooncake", cfg.mooncake.url, None))
        if cfg.raw_twins:
            out += [
                (f"{name} codec=raw", tier_class, twin_url(url, "raw"), folder)
                for name, tier_class, url, folder in out
                if tier_class != HOST_MEMORY
            ]
        return out

    def _open(self) -> None:
        cfg, geo = self.config, self.config.geometry
        report = self.report
        for name, tier_class, url, _ in self.kvtier_urls():
            self._try_open(
                name,
                lambda n=name, c=tier_class, u=url: KvtierSystem(
                    n, c, u, geo, queue_chunks=max(1024, 2 * cfg.prefix_chunks)
                ),
            )
        slab = self._system("kvtier slab://")
        if isinstance(slab, KvtierSystem):
            profile = getattr(slab.tier, "io_profile", None)
            if profile is not None and not profile.direct:
                slab.page_cache = True
                slab.directory = cfg.directory / "kvtier-slab"
                report.notes.append("slab:// could not use O_DIRECT here: its reads are buffered")
        self._try_open("memcpy", lambda: CopyReference(geo.chunk_bytes, self._slots()))
        if "reference" in cfg.redis:
            self._try_open("redis-py GET", lambda: RedisReference(cfg.redis["reference"]))
        if cfg.lmcache:
            self._open_lmcache()
        if cfg.mooncake is not None:
            self._open_mooncake()
        if cfg.fio:
            from kvtier.bench.peers_fio import FioReference

            fio = FioReference(cfg.directory / "fio", geo.chunk_bytes)
            if fio.available:
                self.fio = fio
                self.results["fio"] = SystemResult("fio", LOCAL_DISK, "reference", fio.detail)
            else:
                report.unavailable["fio"] = "fio is not installed (apt-get install fio)"

    def _slots(self) -> int:
        cfg = self.config
        return max(cfg.prefix_chunks, cfg.requests, cfg.chunk_rounds) + 1

    def _open_lmcache(self) -> None:
        from kvtier.bench.peers_lmcache import LMCacheSystem, PeerUnavailable, lmcache_version

        cfg, geo = self.config, self.config.geometry
        try:
            self.report.versions["lmcache"] = lmcache_version()
        except PeerUnavailable as exc:
            self.report.unavailable["LMCache"] = str(exc)
            return
        room = cfg.room_bytes
        makers: list[tuple[str, Callable[[], System]]] = [
            ("LMCache local_cpu", lambda: LMCacheSystem("local_cpu", geo, room)),
            (
                "LMCache local_disk",
                lambda: LMCacheSystem(
                    "local_disk", geo, room, cfg.directory / "lmcache-disk", disk_bytes=room
                ),
            ),
        ]
        if "lmcache" in cfg.redis:
            makers.append(
                (
                    "LMCache redis",
                    lambda: LMCacheSystem("redis", geo, room, redis_url=cfg.redis["lmcache"]),
                )
            )
        for name, make in makers:
            self._try_open(name, make)
        self.report.notes += LMCACHE_NOTES

    def _open_mooncake(self) -> None:
        from kvtier.bench.peers_lmcache import PeerUnavailable
        from kvtier.bench.peers_mooncake import MooncakeSystem, mooncake_version

        cfg = self.config
        assert cfg.mooncake is not None
        try:
            self.report.versions["mooncake"] = mooncake_version()
        except PeerUnavailable as exc:
            self.report.unavailable["Mooncake"] = str(exc)
            return
        for raw in (False, True):
            system = MooncakeSystem(cfg.mooncake, cfg.geometry, raw=raw)
            self._try_open(system.name, lambda s=system: s.open())

    def _try_open(self, name: str, make: Callable[[], System]) -> None:
        from kvtier.bench.peers_lmcache import PeerUnavailable

        try:
            system = make()
        except PeerUnavailable as exc:
            self.report.unavailable[name] = str(exc)
            return
        except KvtierError as exc:
            self.report.unavailable[name] = f"{name} did not open: {exc}"
            return
        except Exception as exc:
            self.report.unavailable[name] = f"{name} did not open ({_brief(exc)})"
            return
        self.systems.append(system)
        self.results[system.name] = SystemResult(
            system.name, system.tier_class, system.side, system.detail
        )

    def _system(self, name: str) -> System | None:
        return next((s for s in self.systems if s.name == name), None)

    # --- the run ------------------------------------------------------------------------------
    def run(self) -> PeersReport:
        """Open every system, run the three phases, close everything; the report."""
        cfg = self.config
        try:
            pool = (
                real_chunks(cfg.geometry, self.on_step)
                if cfg.payload == "real"
                else synthetic_chunks(cfg.geometry, POOL, cfg.seed)
            )
            self._open()
            torch_tokens = any(s.name.startswith("LMCache") for s in self.systems)
            self.maker = PromptMaker(cfg, pool, torch_tokens)
            geo = cfg.geometry
            self.chunk_out = np.zeros(geo.chunk_bytes, dtype=np.uint8)
            self.prefix_out = np.zeros_like(self.maker.prefix_kv)
            self.request_outs = [np.zeros(geo.chunk_bytes, np.uint8) for _ in range(cfg.requests)]
            buffers = [*pool, self.maker.prefix_kv, self.chunk_out, self.prefix_out]
            for system in self.systems:
                self._guarded(
                    system, "set-up", lambda s=system: s.prepare(buffers + self.request_outs)
                )
            self.on_step("opened every system")
            self._warm_up()
            self._chunk_phase()
            self._prefix_phase()
            self._throughput_phase()
        finally:
            for system in self.systems:
                with contextlib.suppress(Exception):
                    system.close()
            if self.fio is not None:
                self.fio.close()
        for result in self.results.values():
            result.summarize(cfg.requests, cfg.geometry.chunk_bytes)
        self.report.results = list(self.results.values())
        return self.report

    def _live(self) -> list[System]:
        return [s for s in self.systems if self.results[s.name].error is None]

    def _guarded(self, system: System, what: str, work: Callable[[], None]) -> None:
        """Run ``work``; a failure marks the system failed (one line) and leaves it out later."""
        try:
            work()
        except Exception as exc:
            self.results[system.name].error = f"{what}: {_brief(exc)}"

    def _warm_up(self) -> None:
        """Each system stores and retrieves one prefix-sized prompt, untimed (memory mapped,
        files made, connections opened)."""
        assert self.maker is not None
        prompt, out = self.maker.prefix(), self.prefix_out
        for system in self._live():

            def work(s: System = system) -> None:
                s.store(prompt)
                s.settle([prompt], self.config.timeout_s)
                got = s.retrieve(prompt, out)
                if got < prompt.n_tokens:
                    raise PeersError(f"retrieved {got} of {prompt.n_tokens} tokens")
                s.forget([prompt])

            self._guarded(system, "warm-up", work)
        self.on_step("warm-up")

    def _round(self, system: System, phase: str, prompt: Prompt, out: np.ndarray) -> None:
        """Store ``prompt``, look it up, retrieve it (cold, then warm where the page cache
        serves reads); each timed; every chunk compared."""
        result = self.results[system.name]
        t0 = time.perf_counter()
        system.store(prompt)
        system.settle([prompt], self.config.timeout_s)
        result.add_sample(phase, "store", time.perf_counter() - t0)
        t0 = time.perf_counter()
        found = system.seen(prompt)
        result.add_sample(phase, "lookup", time.perf_counter() - t0)
        if found < prompt.n_tokens:
            raise PeersError(f"a lookup found {found} of {prompt.n_tokens} tokens just stored")
        reads = ("retrieve", "retrieve_warm") if system.page_cache else ("retrieve",)
        for op in reads:
            if op == "retrieve":
                system.drop_page_cache()
            out.fill(0)
            t0 = time.perf_counter()
            got = system.retrieve(prompt, out)
            result.add_sample(phase, op, time.perf_counter() - t0)
            self._check(system, prompt, out, got)

    def _check(self, system: System, prompt: Prompt, out: np.ndarray, got: int) -> None:
        result = self.results[system.name]
        if got < prompt.n_tokens:
            raise PeersError(f"retrieved {got} of {prompt.n_tokens} tokens it had stored")
        wrong = bad_chunks(prompt, out)
        result.chunks_checked += prompt.n_chunks
        result.wrong_chunks += len(wrong)
        if wrong:
            raise PeersError(f"{len(wrong)} of {prompt.n_chunks} retrieved chunks differ")

    def _chunk_phase(self) -> None:
        cfg, out = self.config, self.chunk_out
        assert self.maker is not None
        kept: dict[str, list[Prompt]] = {s.name: [] for s in self.systems}
        for r in range(cfg.chunk_rounds):
            prompt = self.maker.chunk(r)
            for system in turned(self._live(), r):
                kept[system.name].append(prompt)
                self._guarded(
                    system,
                    f"chunk round {r + 1}",
                    lambda s=system, p=prompt: self._round(s, "chunk", p, out),
                )
            if self.fio is not None and r == 0:
                self._fio("chunk", lambda: self._fio_chunk())
            self.on_step(f"one chunk: round {r + 1}/{cfg.chunk_rounds}")
        self._capacity(kept)
        for system in self._live():
            self._guarded(system, "clean-up", lambda s=system: s.forget(kept[s.name]))
        self.on_step("bytes per token")

    def _capacity(self, kept: dict[str, list[Prompt]]) -> None:
        """Bytes each system holds for the chunk phase's prompts, per token; kvtier's tiers
        also with the other codec (a twin tier given the same chunks)."""
        for system in self._live():
            prompts = kept[system.name]
            tokens = sum(p.n_tokens for p in prompts)
            result = self.results[system.name]
            try:
                held = system.held_bytes()
            except Exception as exc:
                result.notes.append(f"bytes held unknown ({_brief(exc)})")
                continue
            if held is not None and tokens:
                result.bytes_per_token = held / tokens
            if isinstance(system, KvtierSystem) and held is not None and tokens:
                result.codec_bytes_per_token[system.tier.codec] = held / tokens
                self._twin_capacity(system, prompts, result)

    def _twin_capacity(self, system: KvtierSystem, prompts: list[Prompt], result) -> None:
        other = "raw" if system.tier.codec != "raw" else "kv"
        try:
            url = twin_url(system.url, other, "capacity")
            twin = KvtierSystem(
                f"{system.name} ({other})", system.tier_class, url, self.config.geometry
            )
        except Exception as exc:
            result.notes.append(f"codec={other} twin did not open ({_brief(exc)})")
            return
        try:
            for prompt in prompts:
                twin.store(prompt)
            twin.settle(prompts, self.config.timeout_s)
            held = twin.held_bytes()
            if held is not None:
                tokens = sum(p.n_tokens for p in prompts)
                result.codec_bytes_per_token[twin.tier.codec] = held / tokens
            twin.forget(prompts)
        except Exception as exc:
            result.notes.append(f"codec={other} twin failed ({_brief(exc)})")
        finally:
            twin.close()
            folder = twin_folder(url)
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    def _prefix_phase(self) -> None:
        cfg = self.config
        assert self.maker is not None
        out = self.prefix_out
        for r in range(cfg.prefix_rounds):
            prompt = self.maker.prefix()
            for system in turned(self._live(), r):

                def work(s: System = system, p: Prompt = prompt) -> None:
                    try:
                        self._round(s, "prefix", p, out)
                    finally:
                        s.forget([p])

                self._guarded(system, f"prefix round {r + 1}", work)
            if self.fio is not None:
                self._fio("prefix", lambda: self._fio_prefix())
            self.on_step(f"{cfg.prefix_tokens}-token prefix: round {r + 1}/{cfg.prefix_rounds}")

    def _throughput_phase(self) -> None:
        cfg, outs = self.config, self.request_outs
        assert self.maker is not None
        for k, depth in enumerate(cfg.depths):
            for r in range(cfg.throughput_rounds):
                for system in turned(self._live(), k + r):
                    prompts = [self.maker.chunk(i) for i in range(cfg.requests)]
                    self._guarded(
                        system,
                        f"throughput at depth {depth}",
                        lambda s=system, p=prompts, d=depth: self._throughput(s, d, p, outs),
                    )
                if self.fio is not None:
                    self._fio("throughput", lambda d=depth: self._fio_throughput(d))
            self.on_step(f"throughput at {depth} in flight")

    def _throughput(
        self, system: System, depth: int, prompts: list[Prompt], outs: list[np.ndarray]
    ) -> None:
        cfg = self.config
        result = self.results[system.name]
        plan = PassPlan(len(prompts), cfg.geometry.chunk_bytes, depth, 1)
        try:
            stored = run_pass(plan, lambda _w, idx: system.store(prompts[idx[0]]))
            t0 = time.perf_counter()
            system.settle(prompts, cfg.timeout_s)
            seconds = stored.seconds + time.perf_counter() - t0
            result.add_pass(depth, "store", seconds)
            reads = ("retrieve", "retrieve_warm") if system.page_cache else ("retrieve",)
            for op in reads:
                if op == "retrieve":
                    system.drop_page_cache()
                for out in outs:
                    out.fill(0)
                got = [0] * len(prompts)

                def read(_w: int, idx: Sequence[int], got: list[int] = got) -> None:
                    got[idx[0]] = system.retrieve(prompts[idx[0]], outs[idx[0]])

                passed = run_pass(plan, read)
                result.add_pass(depth, op, passed.seconds)
                for prompt, out, n in zip(prompts, outs, got, strict=True):
                    self._check(system, prompt, out, n)
        finally:
            system.forget(prompts)

    # --- fio ----------------------------------------------------------------------------------
    def _fio(self, what: str, work: Callable[[], None]) -> None:
        result = self.results["fio"]
        if result.error is not None:
            return
        try:
            work()
        except Exception as exc:
            result.error = f"fio {what}: {_brief(exc)}"

    def _fio_chunk(self) -> None:
        assert self.fio is not None
        stats = self.fio.chunk(self.config.chunk_rounds)
        self.results["fio"].latency.setdefault("chunk", {}).update(stats)

    def _fio_prefix(self) -> None:
        assert self.fio is not None
        for op, seconds in self.fio.prefix(self.config.prefix_chunks).items():
            self.results["fio"].add_sample("prefix", op, seconds)

    def _fio_throughput(self, depth: int) -> None:
        assert self.fio is not None
        for op, passed in self.fio.throughput(self.config.requests, depth).items():
            self.results["fio"].add_pass(depth, op, passed.seconds)


def twin_url(url: str, codec: str, tag: str = "") -> str:
    """``url`` storing with ``codec``, apart from the original: a disk tier in a folder of its
    own, a shared tier under a key prefix of its own (a memory tier is apart already)."""
    from kvtier.tiers import TierURL
    from kvtier.tiers.registry import DIRECTORY_SCHEMES, replace_options

    parsed = TierURL.parse(url)
    apart = f"{codec}{'-' + tag if tag else ''}"
    if parsed.scheme in DIRECTORY_SCHEMES:
        folder = parsed.path.rstrip("/")
        url = url.replace(f"://{folder}", f"://{folder}-{apart}", 1)
    elif parsed.scheme != "memory":
        url = replace_options(url, prefix=f"kvtier-{apart}")
    return replace_options(url, codec=codec)


def twin_folder(url: str) -> Path | None:
    """The folder a disk tier's URL keeps its files in (None for other tiers)."""
    from kvtier.tiers import TierURL
    from kvtier.tiers.registry import DIRECTORY_SCHEMES

    parsed = TierURL.parse(url)
    return Path(parsed.path) if parsed.scheme in DIRECTORY_SCHEMES else None


def free_disk_bytes(directory: Path) -> int:
    """Free bytes on the filesystem holding ``directory`` (its nearest existing parent)."""
    path = directory
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


__all__ = [
    "EMBEDDED",
    "PAYLOADS",
    "MooncakeAddress",
    "PeersBench",
    "PeersConfig",
    "PeersReport",
    "PromptMaker",
    "SystemResult",
    "free_disk_bytes",
    "real_chunks",
    "synthetic_chunks",
    "turned",
    "twin_folder",
    "twin_url",
]
