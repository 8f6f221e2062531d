"""What ``kvtier bench serve`` runs: the systems, the two datasets' sizes, vLLM's KV pool and
kvtier's tiers, each system's ``--kv-transfer-config``, and the issue's thresholds and target
shape (shown next to what is measured, never assumed).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvtier.bench.serve_client import prefix_repetition_args, random_args, sessions_args
from kvtier.bench.serve_trace import TraceSlice, timed_trace_args
from kvtier.errors import ConfigError
from kvtier.harness.vllm_server import BLOCK_TOKENS, check_chunk_tokens, min_pool_blocks

#: Every system, in the order they run: vLLM alone (its prefix cache), vLLM alone with a pool
#: that holds every token the run creates (the best any tiering could do: the ceiling), kvtier
#: (host memory then disk; layer by layer where its default says), kvtier on the same tiers
#: with loads and saves layer by layer beside the forward, and whole (a load before the
#: forward, the saves before the step ends), kvtier with the disk tier only,
#: vLLM's ExampleConnector (safetensors files on disk).
SYSTEMS = (
    "vllm", "ceiling", "kvtier", "kvtier-layerwise", "kvtier-whole", "kvtier-disk", "example"
)  # fmt: skip
#: The systems a run has unless told otherwise.
DEFAULT_SYSTEMS = ("vllm", "kvtier", "kvtier-disk", "example")
CEILING = "ceiling"
#: Other names a system goes by on the command line.
SYSTEM_ALIASES = {"oracle": CEILING}
REFERENCE = "vllm"
#: Systems the no-reuse (random) throughput check compares.
RANDOM_SYSTEMS = ("vllm", "kvtier")
CONNECTOR_MODULE = "kvtier.engines.vllm.connector"
DEFAULT_DIR = Path(".kvtier") / "bench-serve"

#: The issue's thresholds (shown next to the measured ratios).
TTFT_SPEEDUP_TARGET = 3.0
THROUGHPUT_TOLERANCE = 0.03
DISK_VS_EXAMPLE_TARGET = 0.5
#: How much slower layer-by-layer loading's TTFT p50 may be than whole-request loading's and
#: still count as no worse (this machine's run-to-run drift).
LAYERWISE_TTFT_TOLERANCE = 0.05
#: The share of the ceiling's gain over vLLM alone kvtier is to capture (TTFT mean, duration).
GAIN_SHARE_TARGET = 0.9
#: Below this share of vLLM alone's figure, the ceiling's gain is noise: nothing to gain, and
#: kvtier is to stay within it of vLLM alone.
NOTHING_TO_GAIN = 0.03
#: The wait for KV with preloading, as a share of the wait when loading on demand.
PRELOAD_WAIT_TARGET = 0.2
#: The issue's workload shape for those thresholds.
TARGET_PROMPTS_PER_PREFIX = 4
TARGET_PREFIX_TOKENS = 4096
TARGET_PROMPTS = 48
TARGET_CONCURRENCY = (1, 4, 8)
#: Room a chat template takes: its system turn and generation prompt, then each message's markers.
CHAT_TEMPLATE_TOKENS = 64
CHAT_MESSAGE_TOKENS = 8


def _at_least_one(*options: tuple[str, int]) -> None:
    """ConfigError naming the first of the (option, value) pairs whose value is below 1."""
    for name, value in options:
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")


@dataclass(frozen=True)
class PrefixWorkload:
    """The reuse workload: ``prompts`` over ``num_prefixes`` shared prefixes.

    By default vLLM's ``prefix_repetition`` dataset (each prompt a prefix and a random suffix of
    ``suffix_tokens``, shuffled). With ``sessions``, multi-turn chats instead
    (:mod:`kvtier.bench.serve_sessions`): ``num_prefixes`` sessions of ``prompts_per_prefix``
    turns, the first user message of ``prefix_tokens + suffix_tokens`` tokens, each later turn
    adding an answer of ``output_tokens`` and a user message of ``suffix_tokens``.
    """

    prefix_tokens: int = 2048
    suffix_tokens: int = 64
    num_prefixes: int = 4
    prompts: int = 16
    output_tokens: int = 4
    sessions: bool = False
    trace: TraceSlice | None = None

    @property
    def dataset(self) -> str:
        """The name its runs go by."""
        if self.trace is not None:
            return "trace"
        return "sessions" if self.sessions else "prefix_repetition"

    @property
    def requests(self) -> int:
        """Requests a run sends."""
        return self.trace.requests if self.trace is not None else self.prompts

    @property
    def prompts_per_prefix(self) -> int:
        return self.prompts // self.num_prefixes

    @property
    def prefix_blocks(self) -> int:
        """KV blocks all the prefixes fill together."""
        if self.trace is not None:
            return self.trace.distinct_tokens // BLOCK_TOKENS
        return self.num_prefixes * self.prefix_tokens // BLOCK_TOKENS

    @property
    def created_tokens(self) -> int:
        """Tokens one run creates: every prefix once, every request's new tokens."""
        if self.trace is not None:
            return self.trace.tokens
        new = self.suffix_tokens + self.output_tokens
        return self.num_prefixes * self.prefix_tokens + self.prompts * new

    @property
    def cold_tokens(self) -> int:
        """A first request's prompt: the warm-up's timed cold prompt is this long."""
        if self.trace is not None:
            return self.trace.median_input
        return self.prefix_tokens + self.suffix_tokens

    @property
    def request_tokens(self) -> int:
        """Tokens of the longest request with its answer (a session's last turn, with room for
        the chat template's markers)."""
        if self.trace is not None:
            return self.trace.longest
        if not self.sessions:
            return self.prefix_tokens + self.suffix_tokens + self.output_tokens
        turns = self.prompts_per_prefix
        markers = CHAT_TEMPLATE_TOKENS + 2 * turns * CHAT_MESSAGE_TOKENS
        return self.prefix_tokens + turns * (self.suffix_tokens + self.output_tokens) + markers

    def client_args(self, dataset_file: Path | None = None) -> tuple[str, ...]:
        """The client's dataset options (``dataset_file``: the sessions' prompts or the
        trace's slice)."""
        if self.trace is not None:
            if dataset_file is None:
                raise ValueError("a trace workload is sent from a dataset file")
            return timed_trace_args(dataset_file, self.trace.block_tokens)
        if self.sessions:
            if dataset_file is None:
                raise ValueError("a sessions workload is sent from a dataset file")
            return sessions_args(dataset_file, self.output_tokens)
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
class PreloadWorkload:
    """The preloading check: ``hits`` prompts of ``tokens`` whose KV is on disk, queued among
    as many cold ones."""

    tokens: int = 2112
    hits: int = 6
    chunk_tokens: int = 256
    seed: int = 0

    @property
    def pool_blocks(self) -> int:
        """vLLM's KV pool: two requests (the rest wait in its queue)."""
        return 2 * -(-(self.tokens + 1) // BLOCK_TOKENS)


@dataclass(frozen=True)
class ServeBenchConfig:
    """What ``kvtier bench serve`` runs.

    ``pool_blocks`` (None: half the blocks all prefixes fill, at least one request) is vLLM's
    KV pool for every system; ``max_model_len`` (None: the longest request, rounded up).
    ``max_batched_tokens``: vLLM's ``--max-num-batched-tokens``, every system (None: vLLM's
    default; vLLM's ExampleConnector needs a whole prompt in one step).
    ``dram_size``/``disk_size``: kvtier's tiers in bytes (None: sized from the workload).
    ``random``: the no-reuse check (None: skipped). ``preload``: the preloading check (None:
    skipped). ``keep``: leave the tiers' data in place.
    ``quiet_load``: before each client run, wait (up to ``quiet_wait_s``) until the machine's
    1-minute load average is at most this (None: do not wait); other work on a shared CPU
    slows every system's prefill alike only when it lasts the whole run.
    ``reuse_rounds``: how often every system runs the reuse workload at every concurrency,
    each round starting every system afresh in an order turned by one a round (a machine whose
    speed drifts then slows no system's runs more than another's); the report takes the
    median over rounds of each figure. ``interleave``: every system's server stays up instead
    and the runs alternate between them — at each concurrency, round after round, every system
    in turn (the order turned by one a round), each round with a fresh dataset (a seed of its
    own, the same for every system): paired runs lie minutes apart, not a whole system's
    turn, and the report compares kvtier with vLLM alone round by round.
    """

    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    tensor_parallel: int = 1
    concurrency: tuple[int, ...] = (1, 4)
    prefix: PrefixWorkload = field(default_factory=PrefixWorkload)
    random: RandomWorkload | None = field(default_factory=RandomWorkload)
    preload: PreloadWorkload | None = None
    pool_blocks: int | None = None
    max_model_len: int | None = None
    max_batched_tokens: int | None = None
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
    reuse_rounds: int = 1
    interleave: bool = False

    def __post_init__(self) -> None:
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown or not self.systems:
            raise ConfigError(
                f"--systems: unknown {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(SYSTEMS)}"
            )
        if len(set(self.systems)) != len(self.systems):
            raise ConfigError("--systems: each system once")
        _at_least_one(("--reuse-rounds", self.reuse_rounds))
        if self.tensor_parallel < 1:
            raise ConfigError(f"--tensor-parallel must be at least 1, got {self.tensor_parallel}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError("--concurrency: positive integers, e.g. 1,4,8")
        p = self.prefix
        _at_least_one(
            ("--prefix-len", p.prefix_tokens),
            ("--suffix-len", p.suffix_tokens),
            ("--num-prefixes", p.num_prefixes),
            ("--num-prompts", p.prompts),
            ("--output-len", p.output_tokens),
        )
        if p.prompts < p.num_prefixes:
            raise ConfigError(
                f"--num-prompts {p.prompts} gives no prompt to some of the "
                f"{p.num_prefixes} prefixes; give at least --num-prefixes prompts"
            )
        if p.sessions and p.trace is not None:
            raise ConfigError("--sessions and --trace are two workloads; give one")
        if p.sessions and p.prompts % p.num_prefixes:
            raise ConfigError(
                f"--num-prompts {p.prompts} does not give each of the {p.num_prefixes} sessions "
                "the same number of turns; give a multiple of --num-prefixes"
            )
        if p.sessions and max(self.concurrency) > p.num_prefixes:
            raise ConfigError(
                f"--concurrency {max(self.concurrency)} could send a session's next turn before "
                f"its previous one ends; give at most --num-prefixes ({p.num_prefixes})"
            )
        r = self.random
        if r is not None:
            _at_least_one(
                ("--random-input-len", r.input_tokens),
                ("--random-output-len", r.output_tokens),
                ("--random-prompts", r.prompts),
                ("--random-concurrency", r.concurrency),
                ("--repeat", r.repeats),
            )
        w = self.preload
        if w is not None and (w.tokens <= w.chunk_tokens or w.hits < 1):
            raise ConfigError(
                f"the preload check needs prompts longer than a chunk ({w.chunk_tokens} tokens) "
                f"and at least one of them; got {w.hits} of {w.tokens}"
            )
        check_chunk_tokens(self.chunk_tokens)
        longest = self.longest_request()
        if self.max_model_len is not None and self.max_model_len < longest:
            raise ConfigError(
                f"--max-model-len {self.max_model_len} is shorter than the longest request "
                f"({longest} tokens with its answer)"
            )
        if self.max_batched_tokens is not None and self.max_batched_tokens < BLOCK_TOKENS:
            raise ConfigError(
                f"--max-num-batched-tokens must be at least {BLOCK_TOKENS}, "
                f"got {self.max_batched_tokens}"
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

    def ceiling_pool(self) -> int:
        """The ceiling's pool in blocks: every token the prefix runs create (each concurrency's
        prefixes are fresh), each request's last block apart, and one request more."""
        p = self.prefix
        tokens = p.created_tokens * len(self.concurrency)
        requests = p.requests * len(self.concurrency)
        blocks = -(-tokens // BLOCK_TOKENS) + requests + min_pool_blocks(self.model_len())
        return max(self.pool(), blocks)

    def engine_args(self) -> tuple[str, ...]:
        """Arguments every system's server gets (prefix caching on, the seed, the step size,
        the tensor-parallel ranks)."""
        args = ("--enable-prefix-caching", "--seed", str(self.seed))
        if self.max_batched_tokens is not None:
            args += ("--max-num-batched-tokens", str(self.max_batched_tokens))
        if self.tensor_parallel > 1:
            args += ("--tensor-parallel-size", str(self.tensor_parallel))
        return args

    def engine_env(self) -> dict[str, str]:
        """Environment every system's server gets: with tensor parallelism, one OpenMP thread
        per rank (the ranks share the machine's cores alike in every system)."""
        return {"OMP_NUM_THREADS": "1"} if self.tensor_parallel > 1 else {}

    def ordered_systems(self) -> list[str]:
        return [s for s in SYSTEMS if s in self.systems]

    def run_seed(self, index: int, round_: int = 0) -> int:
        """The seed of the reuse run at the ``index``-th concurrency in ``round_``: the same in
        every round where each round starts the servers afresh, a fresh one per round where they
        stay up (``interleave``: nothing a server kept from an earlier round is asked for)."""
        return self.seed + index + (round_ * len(self.concurrency) if self.interleave else 0)

    def run_seeds(self) -> list[int]:
        """Every seed the reuse runs use (each needs its dataset)."""
        rounds = self.reuse_rounds if self.interleave else 1
        return [self.run_seed(i, r) for r in range(rounds) for i in range(len(self.concurrency))]

    def round_order(self, round_: int) -> list[str]:
        """The systems in the order reuse round ``round_`` starts them: turned by one a round."""
        order = self.ordered_systems()
        turn = round_ % len(order)
        return order[turn:] + order[:turn]

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
        if p.trace is not None:
            return ["a trace's slice, not the target run's prefix workload"]
        gaps = []
        if p.prompts_per_prefix < TARGET_PROMPTS_PER_PREFIX:
            per = "turns per session" if p.sessions else "prompts per prefix"
            gaps.append(f"{p.prompts_per_prefix} {per} < {TARGET_PROMPTS_PER_PREFIX}")
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

    def ceiling_caveats(self) -> list[str]:
        """What the ceiling gains besides keeping KV (empty: nothing): where vLLM's pool cannot
        hold the highest concurrency's running requests, the ceiling's larger pool also runs
        more of them at once, which no tiering gives."""
        if CEILING not in self.systems or not self.concurrency:
            return []
        most = max(self.concurrency)
        per = -(-self.prefix.request_tokens // BLOCK_TOKENS)
        fits = self.pool() // per
        if fits >= most:
            return []
        return [
            f"the pool's {self.pool()} blocks hold {fits} of the longest requests at once, "
            f"fewer than concurrency {most}: there the ceiling's larger pool also runs more "
            "requests at once, a gain no tiering gives (--pool-blocks "
            f"{most * per} holds them)"
        ]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.prefix.trace is not None:
            out["prefix"]["trace"] = self.prefix.trace.as_dict()
        out["work_dir"] = str(self.work_dir)
        out["shm_dir"] = str(self.shm_dir)
        out["pool_blocks_used"] = self.pool()
        out["ceiling_pool_blocks"] = self.ceiling_pool()
        out["ceiling_caveats"] = self.ceiling_caveats()
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
    new = p.suffix_tokens + (p.output_tokens if p.sessions else 0)  # a turn stores its answer
    tokens = p.num_prefixes * p.prefix_tokens + p.prompts * new
    level = (p.created_tokens if p.trace is not None else tokens) * kv_bytes_per_token
    total = level * len(config.concurrency)
    if config.random is not None:
        r = config.random
        total += r.prompts * r.input_tokens * r.repeats * kv_bytes_per_token
    dram = config.dram_size or max(64 << 20, int(level * 1.25))
    disk = config.disk_size or max(256 << 20, 2 * total)
    return dram, disk


#: The connector option each layer-by-layer comparison system sets.
LAYERWISE_OPTION = {"kvtier-layerwise": {"layerwise": True}, "kvtier-whole": {"layerwise": False}}


def kvtier_transfer_config(
    tiers: list[str], chunk_tokens: int, records: Path | None = None, **options: Any
) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for kvtier's connector over ``tiers`` (fast→slow);
    ``records``: the JSON-lines file of one line per request it looked up; ``options``: more
    connector options."""
    extra: dict[str, Any] = {"tiers": tiers, "chunk_tokens": chunk_tokens, **options}
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
    """The ``--kv-transfer-config`` of ``system`` (None for vLLM alone and the ceiling)."""
    if system in ("vllm", CEILING):
        return None
    if system in ("kvtier", "kvtier-layerwise", "kvtier-whole"):
        return kvtier_transfer_config(
            [
                f"slab://{paths.shm}?size={_mib(dram)}&name=dram",
                f"slab://{paths.disk}?size={_mib(disk)}&name=disk",
            ],
            chunk_tokens,
            paths.records,
            **LAYERWISE_OPTION.get(system, {}),
        )
    if system == "kvtier-disk":
        disk_only = [f"slab://{paths.disk}?size={_mib(disk)}&name=disk"]
        return kvtier_transfer_config(disk_only, chunk_tokens, paths.records)
    if system == "example":
        return example_transfer_config(paths.disk)
    raise ConfigError(f"unknown system {system!r}")


__all__ = [
    "CEILING",
    "DEFAULT_SYSTEMS",
    "DISK_VS_EXAMPLE_TARGET",
    "LAYERWISE_TTFT_TOLERANCE",
    "PRELOAD_WAIT_TARGET",
    "REFERENCE",
    "SYSTEMS",
    "THROUGHPUT_TOLERANCE",
    "TTFT_SPEEDUP_TARGET",
    "PrefixWorkload",
    "PreloadWorkload",
    "RandomWorkload",
    "ServeBenchConfig",
    "SystemPaths",
    "tier_sizes",
    "transfer_config",
]
