"""What one simulation runs: the engine, kvtier's tiers and policies, the links, the replicas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvtier.errors import ConfigError
from kvtier.policy.store_admission import ADMIT_MODES
from kvtier.sim.tiers import TierSpec
from kvtier.sim.timing import VLLM_CPU_BATCHED_TOKENS, StepTimer

Preemption = Literal["recompute", "offload"]
Scheduling = Literal["fcfs", "priority"]
Routing = Literal["session", "least-loaded", "round-robin", "prefix", "tier"]
#: The routing policies, in the order reports list them (see :mod:`kvtier.sim.routing`).
ROUTINGS: tuple[str, ...] = ("session", "least-loaded", "round-robin", "prefix", "tier")


@dataclass(frozen=True)
class EngineSpec:
    """One replica's engine, in vLLM's terms.

    ``pool_blocks`` blocks of ``block_tokens`` tokens hold the KV; ``max_batched_tokens`` is the
    token budget of a step (chunked prefill), ``max_seqs`` the running requests at most;
    ``watermark`` the share of the pool a new request must leave free (vLLM V1 keeps none);
    ``prefix_caching`` finds full blocks by chained key; ``reserve_full_prompt`` admits a
    waiting request only when its whole prompt fits in the free blocks, not only its first
    chunk (vLLM's ``scheduler_reserve_full_isl``, on by default), and an asynchronous load only
    when it leaves the blocks the prefills under way still need. A request whose blocks run out is
    preempted: its KV is dropped and recomputed (``recompute``, vLLM's only way), or reloaded
    from kvtier's tiers where it was written through (``offload``, kvtier's connector).
    ``kv_bytes_per_token``: one token's KV on one replica (all its ranks).
    """

    pool_blocks: int
    block_tokens: int
    kv_bytes_per_token: float
    max_batched_tokens: int = VLLM_CPU_BATCHED_TOKENS
    max_seqs: int = 128
    watermark: float = 0.0
    prefix_caching: bool = True
    scheduling: Scheduling = "fcfs"
    preemption: Preemption = "recompute"
    max_model_len: int | None = None
    reserve_full_prompt: bool = True

    def __post_init__(self) -> None:
        if self.pool_blocks < 1 or self.block_tokens < 1:
            raise ConfigError("the engine needs a pool of at least one block of one token")
        if self.max_batched_tokens < 1 or self.max_seqs < 1:
            raise ConfigError("max batched tokens and max sequences must be at least 1")
        if not 0 <= self.watermark < 1:
            raise ConfigError(f"watermark is a share of the pool in [0, 1), got {self.watermark}")
        if self.kv_bytes_per_token <= 0:
            raise ConfigError("kv_bytes_per_token must be positive")
        if self.preemption not in ("recompute", "offload"):
            raise ConfigError(f"preemption is recompute or offload, not {self.preemption!r}")
        if self.scheduling not in ("fcfs", "priority"):
            raise ConfigError(f"scheduling is fcfs or priority, not {self.scheduling!r}")


@dataclass(frozen=True)
class KvtierSpec:
    """kvtier's connector: chunk size, tiers (fast→slow), and what it does with them.

    ``sync_first``: chunks all in the first tier load inside the step that schedules the
    request (the engine waits); others load while the engine runs other requests.
    ``decide``: the load-or-recompute cut (else every hit loads). ``preload``: a queued
    request's chunks on slower tiers are copied into the first tier in arrival order, at most
    ``preload_bytes`` in flight, and a request whose copy is under way when its turn comes is
    held back up to ``preload_wait_s``. ``admit``: which completed chunks are stored, as the
    connector's option (``always``, ``repeat``, ``auto``). ``host_link``: bytes/s of the link KV
    crosses between the engine and host memory (None: the engine computes on the host).
    ``token_cost_s`` and ``request_cost_s`` are what the connector adds to a step: per prefilled
    token (the worker gathers completed chunks out of the paged cache to store them) and per
    request it looks up (keys, lookups, the decision, in the scheduler). ``contention``: what
    the connector adds to how much each request in flight beyond the first slows a step (its
    threads share the host's cores with the forward), on top of the frontend's (negative: less;
    the sum is kept at zero or more).
    """

    tiers: tuple[TierSpec, ...]
    chunk_tokens: int
    sync_first: bool = True
    decide: bool = True
    preload: bool = True
    preload_bytes: float = 256 * 2**20
    preload_wait_s: float = 2.0
    store: bool = True
    admit: str = "auto"
    host_link_bandwidth: float | None = None
    host_link_latency_s: float = 0.0
    token_cost_s: float = 0.0
    request_cost_s: float = 0.0
    contention: float = 0.0

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("kvtier needs at least one tier (or run without kvtier)")
        if self.chunk_tokens < 1:
            raise ConfigError("chunk_tokens must be at least 1")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tier names must differ, got {names}")
        if self.admit not in ADMIT_MODES:
            raise ConfigError(f"admit must be one of {ADMIT_MODES}, got {self.admit!r}")


@dataclass(frozen=True)
class FrontendSpec:
    """The server process between clients and an engine (vLLM's API server), as one queue.

    A request costs it ``in_s`` of work before the engine sees it, each generated token
    ``out_s`` before the client does; it works at full speed while its engine idles and at
    ``share`` of it while the engine steps (on a host whose cores the engine's forward keeps
    busy, the two share them). ``contention``: how much each request in flight beyond the first
    slows the engine's steps (its streaming, and the client's, take the host's cores from the
    forward): a step takes ``1 + contention · (in flight - 1)`` times its time. None in a
    :class:`SimConfig`: requests and tokens pass at once and steps take their time.
    ``jitter``: how much a step's time varies on a shared host (σ of its logarithm): each step
    takes its time × a log-normal factor of median 1, drawn from the simulation's seeded
    generator (see :func:`kvtier.sim.replays.replay` for figures that do not hang on one draw).
    """

    in_s: float = 0.0
    out_s: float = 0.0
    share: float = 1.0
    contention: float = 0.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.in_s < 0 or self.out_s < 0:
            raise ConfigError("the frontend's work per request and per token must be >= 0")
        if self.contention < 0:
            raise ConfigError("the frontend's contention must be >= 0")
        if self.jitter < 0:
            raise ConfigError("the frontend's jitter must be >= 0")
        if not 0 < self.share <= 1:
            raise ConfigError(f"the frontend's share must be in (0, 1], got {self.share}")


@dataclass(frozen=True)
class SimConfig:
    """A whole simulation.

    ``timer``: step times (roofline or measured). ``kvtier``: None runs the engines alone.
    ``replicas`` engines share the shared tiers and one network link of ``network_bandwidth``
    bytes/s; ``routing`` picks each request's replica (:mod:`kvtier.sim.routing`).
    ``concurrency``: the client's requests in flight at most (None: open loop, every request
    sent when it arrives). ``closed_loop``: a session's next turn is sent
    ``after_s`` after its previous answer (traces that record it), else at its arrival time.
    ``slo_ttft_s``/``slo_tpot_s``: the service level goodput counts against.
    """

    engine: EngineSpec
    timer: StepTimer
    kvtier: KvtierSpec | None = None
    replicas: int = 1
    routing: Routing = "session"
    network_bandwidth: float = 12.5e9
    network_latency_s: float = 20e-6
    concurrency: int | None = None
    closed_loop: bool = True
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    seed: int = 0
    frontend: FrontendSpec | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError("at least one replica")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError("concurrency must be at least 1 (or open loop)")
        if self.routing not in ROUTINGS:
            raise ConfigError(f"routing is one of {', '.join(ROUTINGS)}, not {self.routing!r}")
        if self.kvtier is not None:
            ratio = self.kvtier.chunk_tokens / self.engine.block_tokens
            if self.kvtier.chunk_tokens % self.engine.block_tokens:
                raise ConfigError(
                    f"kvtier's chunk ({self.kvtier.chunk_tokens} tokens) must be a whole number "
                    f"of engine blocks ({self.engine.block_tokens} tokens), got {ratio:.2f}"
                )
        if self.engine.preemption == "offload" and self.kvtier is None:
            raise ConfigError("preemption by offload needs kvtier's tiers")


__all__ = [
    "ROUTINGS",
    "EngineSpec",
    "FrontendSpec",
    "KvtierSpec",
    "Preemption",
    "Routing",
    "Scheduling",
    "SimConfig",
]
