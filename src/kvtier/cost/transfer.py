"""Seconds to bring KV back from a tier: fixed per-load costs, storage read, codec decode,
host→device copy."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.specs.hardware import Link, Storage
from kvtier.specs.model import ModelSpec

#: Prefix lookup per request: the connector hashes the prompt's chained block keys and asks the
#: store's index which of them it holds (vLLM's ``get_num_new_matched_tokens`` calling into the
#: connector; py-kvcache and LMCache answer it with a metadata look-up per request). Python
#: hashing of a few hundred block keys plus one index query/IPC round trip: about 1 ms.
DEFAULT_LOOKUP_S = 1e-3
#: Engine steps a load adds to the request's critical path. vLLM's KV connectors load
#: asynchronously: the step that schedules the request only issues the load
#: (``WAITING_FOR_REMOTE_KVS``), a later step reports it finished (``get_finished``), and only
#: the step after that schedules the prefill of the remaining tokens.
DEFAULT_ENGINE_STEPS = 2
#: Host-side cost of one engine step with no forward to run: schedule, build the step's
#: connector metadata, broadcast it to the worker process, collect its output (vLLM V1
#: engine core + multiprocess executor), about 1.5 ms.
DEFAULT_ENGINE_STEP_S = 1.5e-3
#: Tokens per KV block in the engine's paged cache (vLLM's default ``--block-size`` on CUDA).
DEFAULT_BLOCK_TOKENS = 16
#: Host-side cost of issuing one host→device copy (``cudaMemcpyAsync`` from a C++ loop, as
#: vLLM's ``swap_blocks`` does once per block, per layer, for K and for V): about 2 µs each.
#: Copies are issued while earlier ones run, so the copy stage lasts as long as the slower of
#: issuing them and the DMA itself.
DEFAULT_COPY_LAUNCH_S = 2e-6


@dataclass(frozen=True)
class LoadOverheads:
    """What a real engine load path costs beyond moving bytes: per-request fixed costs (lookup,
    the connector's asynchronous scheduling of the load) and per-copy issue costs of scattering
    KV into the paged cache, one copy per block, per layer, per K/V tensor.

    These belong to paths derived from specs (:meth:`TransferPath.from_specs`); a path fitted to
    measured loads already contains them.
    """

    lookup_s: float = DEFAULT_LOOKUP_S
    engine_steps: int = DEFAULT_ENGINE_STEPS
    engine_step_s: float = DEFAULT_ENGINE_STEP_S
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    copy_launch_s: float = DEFAULT_COPY_LAUNCH_S

    def __post_init__(self) -> None:
        if min(self.lookup_s, self.engine_step_s, self.copy_launch_s) < 0:
            raise ConfigError("load overheads must not be negative")
        if self.engine_steps < 0 or self.block_tokens < 1:
            raise ConfigError("engine steps must be >= 0 and block tokens >= 1")

    @property
    def request_s(self) -> float:
        """Fixed seconds per load: the lookup plus the engine steps the load waits through."""
        return self.lookup_s + self.engine_steps * self.engine_step_s

    def copy_bytes(self, model: ModelSpec, tp: int = 1) -> float:
        """Bytes of one host→device copy: one block of one layer's K (or V, or MLA latent) on
        one tensor-parallel rank."""
        tensors = 1 if model.attention == "mla" else 2
        return self.block_tokens * model.kv_bytes_per_token(tp) / (model.layers * tensors)


#: The overheads spec-derived paths carry unless told otherwise.
DEFAULT_LOAD_OVERHEADS = LoadOverheads()


@dataclass(frozen=True)
class TransferPath:
    """One way KV returns to where the model consumes it.

    ``read_bandwidth`` is in stored bytes/s, ``decode_bandwidth`` in raw bytes/s (None: no codec
    stage), ``device_bandwidth`` the host→device copy in raw bytes/s (None when KV is consumed on
    the host). ``codec_ratio`` is raw/stored bytes. When ``overlapped`` the stages run as a
    pipeline over chunks, so a transfer costs the first-byte latency plus its slowest stage;
    otherwise the stages run one after another and their times add up.

    ``request_s`` is paid once per load on top of the first-byte latency (lookup, scheduling of
    the load). When ``copy_bytes`` is set the host→device stage is issued as copies of that many
    raw bytes costing ``copy_launch_s`` each to issue, and lasts as long as the slower of issuing
    them and the DMA. Both default to nothing, as for a path fitted to measured loads.
    """

    name: str
    latency_s: float
    read_bandwidth: float
    device_bandwidth: float | None = None
    codec_ratio: float = 1.0
    decode_bandwidth: float | None = None
    overlapped: bool = True
    request_s: float = 0.0
    copy_bytes: float | None = None
    copy_launch_s: float = 0.0

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.request_s < 0 or self.copy_launch_s < 0:
            raise ConfigError(f"path {self.name!r}: latency and overheads must not be negative")
        if self.read_bandwidth <= 0:
            raise ConfigError(f"path {self.name!r}: read bandwidth must be positive")
        for field in ("device_bandwidth", "decode_bandwidth", "copy_bytes"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise ConfigError(f"path {self.name!r}: {field} must be positive or None")
        if self.codec_ratio <= 0:
            raise ConfigError(f"path {self.name!r}: codec ratio (raw/stored) must be positive")

    @classmethod
    def from_specs(
        cls,
        storage: Storage,
        link: Link | None,
        *,
        codec_ratio: float = 1.0,
        decode_bandwidth: float | None = None,
        overlapped: bool | None = None,
        sharers: int = 1,
        name: str | None = None,
        overheads: LoadOverheads | None = DEFAULT_LOAD_OVERHEADS,
        model: ModelSpec | None = None,
        gpudirect: bool = False,
    ) -> TransferPath:
        """The path from a storage medium over a host link (None: KV stays on the host).

        ``sharers`` ranks read the medium at once (tensor parallelism): each gets an equal share
        of its read bandwidth, while each has its own host link. ``overheads`` are the fixed and
        per-copy costs of the engine's load path (None: the bare medium and link); the per-copy
        costs need the ``model`` (its layers and KV layout), sharded over ``sharers`` ranks.

        Host DRAM is read by the host→device DMA itself, so its two stages overlap. Any other
        medium is read into a host bounce buffer first and then copied to the device, the two
        one after the other, as the engine does (it reads every chunk, then copies them), unless
        ``gpudirect``: then the medium's DMA lands in device memory and there is no host copy.
        ``overlapped`` overrides that choice.
        """
        if sharers < 1:
            raise ConfigError(f"sharers must be at least 1, got {sharers}")
        bounce = link is not None and storage.kind != "dram" and not gpudirect
        copies = overheads is not None and model is not None and link is not None
        copies = copies and not (gpudirect and storage.kind != "dram")
        return cls(
            name=name or storage.name,
            latency_s=storage.latency_s + (link.latency_s if link else 0.0),
            read_bandwidth=storage.read_bandwidth / sharers,
            device_bandwidth=link.achieved_bandwidth if link else None,
            codec_ratio=codec_ratio,
            decode_bandwidth=decode_bandwidth,
            overlapped=(not bounce) if overlapped is None else overlapped,
            request_s=overheads.request_s if overheads else 0.0,
            copy_bytes=overheads.copy_bytes(model, sharers) if copies else None,
            copy_launch_s=overheads.copy_launch_s if copies else 0.0,
        )

    def stage_seconds(self, raw_bytes: float) -> dict[str, float]:
        """Seconds each stage needs for ``raw_bytes`` on its own (latency and request cost
        excluded)."""
        stages = {"read": raw_bytes / self.codec_ratio / self.read_bandwidth}
        if self.decode_bandwidth:
            stages["decode"] = raw_bytes / self.decode_bandwidth
        if self.device_bandwidth:
            dma = raw_bytes / self.device_bandwidth
            issue = raw_bytes / self.copy_bytes * self.copy_launch_s if self.copy_bytes else 0.0
            stages["to_device"] = max(dma, issue)
        return stages

    def seconds(self, raw_bytes: float) -> float:
        """Seconds until ``raw_bytes`` of KV are usable by the model (0 for nothing to move).

        One call is one load: its request cost and first-byte latency are paid once."""
        if raw_bytes < 0:
            raise ConfigError(f"cannot transfer a negative number of bytes ({raw_bytes})")
        if raw_bytes == 0:
            return 0.0
        stages = self.stage_seconds(raw_bytes).values()
        return self.fixed_s + (max(stages) if self.overlapped else sum(stages))

    @property
    def fixed_s(self) -> float:
        """Seconds every load pays whatever its size: request cost plus first-byte latency."""
        return self.request_s + self.latency_s

    @property
    def bandwidth(self) -> float:
        """Raw bytes/s the path sustains for large transfers (fixed costs amortised away)."""
        stages = self.stage_seconds(1.0).values()
        return 1.0 / (max(stages) if self.overlapped else sum(stages))


@dataclass(frozen=True)
class SpillTier:
    """One tier below the engine's memory as the planner and the simulator take it: its role
    (``dram``/``nvme``/``shared``), medium, node capacity (stored bytes; None: unlimited), codec
    ratio (raw/stored) and decode speed (raw bytes/s; None: no codec)."""

    role: str
    storage: Storage
    capacity_bytes: float | None = None
    codec_ratio: float = 1.0
    decode_bandwidth: float | None = None

    def raw_capacity(self) -> float:
        """Raw KV bytes the tier holds (its stored capacity times the codec ratio)."""
        if self.capacity_bytes is None:
            return math.inf
        return self.capacity_bytes * self.codec_ratio

    def path(self, link: Link, *, sharers: int, model: ModelSpec | None) -> TransferPath:
        """The load path from this tier over the host ``link``, read by ``sharers`` ranks at
        once (see :meth:`TransferPath.from_specs`)."""
        return TransferPath.from_specs(
            self.storage,
            link,
            codec_ratio=self.codec_ratio,
            decode_bandwidth=self.decode_bandwidth,
            sharers=sharers,
            name=self.role,
            model=model,
        )
