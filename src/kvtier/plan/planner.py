"""The memory-wall sequence for a model × GPUs × context × concurrency, and what each tier buys.

Workload model (stated, so the numbers can be checked by hand):

- ``concurrency`` sessions each hold a context of ``context`` tokens. A fraction ``prefix_reuse``
  of every request's prompt is a prefix cached by that session's previous turn (multi-turn chat,
  agents); the rest is new prompt, followed by ``output_tokens`` of decode.
- Per GPU, HBM holds weights, a runtime reserve (CUDA context, cuBLAS workspaces, CUDA graphs,
  activation peaks, fragmentation; 10 % of HBM by default, as vLLM's default
  ``gpu_memory_utilization=0.9`` leaves) and the KV pool: everything else.
- KV that does not fit the pool spills, in order, to DRAM, NVMe, then the shared tier; what fits
  nowhere is dropped and recomputed. A request finds its prefix in a place with probability equal
  to that place's share of all sessions' KV. Prefixes are reloaded when that beats recomputing
  (the cost model's comparison), else recomputed.
- Requests arrive at ``request_rate`` per second; without one, the planner uses the GPU's
  closed-loop throughput (one request after another, decode batched over the running sessions).
- Reloads block the GPU (no overlap with other requests' compute): the share of GPU time that
  waits for KV is an upper bound.
- NVMe receives the new KV (new prompt + output tokens) of the sessions that live on it
  (``spill``), or of every request (``through``: write-through stores).
- Tensor parallelism: each GPU holds 1/tp of the weights and its share of the KV heads, has its
  own host link, and shares the node's DRAM/NVMe/network bandwidth with the other ranks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from kvtier.cost import Comparison, CostModel, RooflineCompute
from kvtier.cost.compute import DEFAULT_MBU, DEFAULT_MFU
from kvtier.cost.transfer import SpillTier
from kvtier.errors import ConfigError, SpecError
from kvtier.specs.hardware import GPU, Link
from kvtier.specs.jsonout import finite
from kvtier.specs.model import ModelSpec

NvmeWrites = Literal["spill", "through"]
#: Default share of each GPU's HBM kept out of the KV pool (see module docstring).
DEFAULT_RESERVE_FRACTION = 0.10
#: A GPU that waits for KV this share of its time or more is reported as an event.
WAIT_WARNING = 0.25
#: Up to this many concurrency values, events are found by checking every integer.
_SCAN_LIMIT = 1024
_DAY = 86_400.0


@dataclass(frozen=True)
class PlanRequest:
    """Everything the planner needs; the CLI builds it from flags."""

    model: ModelSpec
    gpu: GPU
    link: Link
    gpus: int = 1
    context: int = 131_072
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    add_breakpoints: bool = True
    prefix_reuse: float = 0.9
    output_tokens: int = 256
    tiers: tuple[SpillTier, ...] = ()
    request_rate: float | None = None
    reserve_fraction: float = DEFAULT_RESERVE_FRACTION
    reserve_bytes: float = 0.0
    mfu: float = DEFAULT_MFU
    mbu: float = DEFAULT_MBU
    prefix_lengths: tuple[int, ...] = ()
    nvme_writes: NvmeWrites = "spill"


@dataclass
class Capacity:
    """HBM budget per GPU and what it holds at the planned context."""

    hbm_bytes_per_gpu: float
    weights_bytes_per_gpu: float
    weights_bytes_total: float
    reserve_bytes_per_gpu: float
    kv_pool_bytes_per_gpu: float
    kv_pool_bytes_total: float
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_token_total: float
    kv_bytes_per_request_per_gpu: float
    kv_bytes_per_request_total: float
    kv_pool_tokens: int
    max_concurrency: int
    overflow_concurrency: int


@dataclass
class TierReport:
    """One tier: capacity, transfer path, reload vs recompute, and when it fills up."""

    role: str
    medium: str
    capacity_bytes: float | None
    codec_ratio: float
    latency_s: float
    request_s: float
    reload_bandwidth_per_gpu: float
    break_even_tokens: int | None
    prefix_reload_s: float
    prefix_recompute_s: float
    reload_wins: bool
    full_at_concurrency: int | None
    rated_dwpd: float | None
    comparisons: list[Comparison]


@dataclass
class Row:
    """The plan at one concurrency. Byte figures are node totals (all GPUs).

    ``ttft_s``: time to first token of one request at this concurrency, with nothing queued
    ahead of it: its wait for the prefix (reloaded from the place it sits, or recomputed where
    the reload loses or the prefix is nowhere; none when it is in HBM), then the prefill of its
    new prompt tokens after the prefix, whose last forward samples the first token.
    It is the average over where the prefix sits, weighted by each place's share of the KV
    (:func:`request_ttft` gives the figure for one place).
    """

    concurrency: int
    kv_demand_bytes: float
    hbm_kv_bytes: float
    spill_bytes: dict[str, float]
    unplaced_bytes: float
    hbm_share: float
    max_context_in_hbm: int
    running_batch: int
    wait_s_per_request: float
    gpu_s_per_request: float
    ttft_s: float
    request_rate: float
    closed_loop: bool
    gpu_busy: float
    gpu_wait_fraction: float
    link_utilization: float
    tier_read_utilization: dict[str, float]
    nvme_write_bytes_per_s: float | None
    nvme_drive_writes_per_day: float | None
    flags: list[str] = field(default_factory=list)


@dataclass
class Event:
    """A step in the failure sequence: the first concurrency at which something gives way."""

    concurrency: int
    kind: str
    message: str


@dataclass
class Plan:
    """The planner's answer; ``to_dict`` gives plain JSON-ready data."""

    inputs: dict
    capacity: Capacity
    tiers: list[TierReport]
    rows: list[Row]
    events: list[Event]
    warnings: list[str]
    notes: list[str]

    def to_dict(self) -> dict:
        """Plain dicts/lists/numbers (no infinities) for ``--json``."""
        return finite(asdict(self))


def gb(n: float | None) -> str:
    """Decimal gigabytes, as datasheets count (``—`` for None/unlimited)."""
    if n is None or not math.isfinite(n):
        return "unlimited"
    return f"{n / 1e9:,.1f} GB"


def default_prefix_lengths(context: int) -> tuple[int, ...]:
    """1k, 4k, 16k, … below the context, then the context itself."""
    lengths, n = [], 1024
    while n < context:
        lengths.append(n)
        n *= 4
    return (*lengths, context)


def _validate(req: PlanRequest) -> None:
    m = req.model
    if req.gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {req.gpus}")
    if req.gpus > 1 and m.attention_heads % req.gpus:
        raise ConfigError(
            f"tensor parallel size {req.gpus} must divide the {m.attention_heads} attention "
            f"heads of {m.name}; choose --gpus among "
            + ", ".join(str(d) for d in range(1, 65) if m.attention_heads % d == 0)
        )
    if req.context < 1:
        raise ConfigError(f"--context must be at least 1 token, got {req.context}")
    if not req.concurrency or min(req.concurrency) < 1:
        raise ConfigError("--concurrency values must be at least 1")
    if not 0 <= req.prefix_reuse <= 1:
        raise ConfigError(f"--reuse is a fraction in [0, 1], got {req.prefix_reuse}")
    if req.output_tokens < 0:
        raise ConfigError(f"--output-tokens must not be negative, got {req.output_tokens}")
    if req.request_rate is not None and req.request_rate <= 0:
        raise ConfigError(f"--rate must be positive requests/s, got {req.request_rate}")
    if not 0 <= req.reserve_fraction < 1 or req.reserve_bytes < 0:
        raise ConfigError("the runtime reserve must be in [0, 100 %) of HBM and not negative")
    if any(n < 1 for n in req.prefix_lengths):
        raise ConfigError("prefix lengths must be at least 1 token")
    for tier in req.tiers:
        if tier.capacity_bytes is not None and tier.capacity_bytes < 0:
            raise ConfigError(f"{tier.role} tier capacity must not be negative")
        if tier.codec_ratio <= 0:
            raise ConfigError(f"{tier.role} codec ratio must be positive")


def _capacity(req: PlanRequest) -> Capacity:
    m, tp = req.model, req.gpus
    hbm = req.gpu.hbm_bytes
    weights = m.weight_bytes(tp)
    reserve = hbm * req.reserve_fraction + req.reserve_bytes
    pool = hbm - weights - reserve
    if pool <= 0:
        raise SpecError(
            f"{m.name} weights need {gb(weights)} per GPU ({m.weight_dtype}, tensor parallel "
            f"{tp}) plus a {gb(reserve)} runtime reserve, more than the {gb(hbm)} HBM of "
            f"{req.gpu.name}; use more --gpus, a smaller --weight-dtype (fp8, int4) or a larger GPU"
        )
    kv_rank = m.kv_bytes_per_token(tp)
    per_req_rank = kv_rank * req.context
    fit = int(pool // per_req_rank)
    return Capacity(
        hbm_bytes_per_gpu=hbm,
        weights_bytes_per_gpu=weights,
        weights_bytes_total=weights * tp,
        reserve_bytes_per_gpu=reserve,
        kv_pool_bytes_per_gpu=pool,
        kv_pool_bytes_total=pool * tp,
        kv_bytes_per_token_per_gpu=kv_rank,
        kv_bytes_per_token_total=kv_rank * tp,
        kv_bytes_per_request_per_gpu=per_req_rank,
        kv_bytes_per_request_total=per_req_rank * tp,
        kv_pool_tokens=int(pool // kv_rank),
        max_concurrency=fit,
        overflow_concurrency=fit + 1,
    )


class _Planner:
    """Evaluates one request at any concurrency; shared state of a single plan() call."""

    def __init__(self, req: PlanRequest):
        _validate(req)
        self.req = req
        self.cap = _capacity(req)
        self.compute = RooflineCompute(req.model, req.gpu, req.gpus, req.mfu, req.mbu)
        self.cost = CostModel(self.compute, self.cap.kv_bytes_per_token_per_gpu)
        self.paths = {
            t.role: t.path(req.link, sharers=req.gpus, model=req.model) for t in req.tiers
        }
        ctx = req.context
        self.prefix = min(round(req.prefix_reuse * ctx), ctx - 1)
        self.new = ctx - self.prefix
        self.recompute_prefix = self.cost.recompute_seconds(self.prefix)
        self.reload_prefix = {
            r: self.cost.reload_seconds(p, self.prefix) for r, p in self.paths.items()
        }
        self.prefill_new = self.compute.prefill_seconds(self.new, self.prefix)

    def ttft(self, place: str | None) -> float:
        """TTFT of this plan's request whose prefix sits in ``place``: ``"hbm"``, a tier's role,
        or None (nowhere)."""
        return self.ttft_of(self.req.context, self.prefix, place)

    def ttft_of(self, prompt: int, cached: int, place: str | None) -> float:
        """TTFT of a request of ``prompt`` tokens whose first ``cached`` sit in ``place``."""
        if place is None:  # held nowhere: the whole prompt is computed
            return self.cost.ttft_seconds(prompt, 0)
        if place == "hbm":
            return self.cost.ttft_seconds(prompt, cached, None)
        if place not in self.paths:
            known = ", ".join(["hbm", *self.paths])
            raise ConfigError(f"no tier {place!r} in this plan (places: {known})")
        return self.cost.ttft_seconds(prompt, cached, self.paths[place])

    def reloads(self, role: str) -> bool:
        return self.prefix > 0 and self.reload_prefix[role] < self.recompute_prefix

    def full_at(self, upto: int) -> int | None:
        """First concurrency at which the tiers up to and including index ``upto`` are full."""
        room = self.cap.kv_pool_bytes_total + sum(
            t.raw_capacity() for t in self.req.tiers[: upto + 1]
        )
        if not math.isfinite(room):
            return None
        return int(room // self.cap.kv_bytes_per_request_total) + 1

    def row(self, c: int) -> Row:
        req, cap = self.req, self.cap
        demand = c * cap.kv_bytes_per_request_total
        hbm = min(demand, cap.kv_pool_bytes_total)
        rest = demand - hbm
        spill: dict[str, float] = {}
        for tier in req.tiers:
            spill[tier.role] = min(rest, tier.raw_capacity())
            rest -= spill[tier.role]
        shares = {role: placed / demand for role, placed in spill.items()}
        unplaced_share = rest / demand
        wait = 0.0
        recompute_share = unplaced_share
        link_bytes = 0.0
        for role, share in shares.items():
            if self.reloads(role):
                wait += share * self.reload_prefix[role]
                link_bytes += share * self.prefix * cap.kv_bytes_per_token_per_gpu
            else:
                recompute_share += share
        batch = max(1, min(c, cap.max_concurrency))
        decode = req.output_tokens * self.compute.decode_step_seconds(req.context, batch) / batch
        gpu = self.prefill_new + recompute_share * self.recompute_prefix + decode
        places = {"hbm": hbm / demand, None: unplaced_share, **shares}
        ttft = sum(share * self.ttft(place) for place, share in places.items() if share)
        closed = req.request_rate is None
        rate = 1.0 / (gpu + wait) if closed else float(req.request_rate)
        link_util = rate * link_bytes / req.link.achieved_bandwidth
        tier_util = {
            t.role: rate
            * shares[t.role]
            * self.prefix
            * cap.kv_bytes_per_token_total
            / t.codec_ratio
            / t.storage.read_bandwidth
            for t in req.tiers
            if self.reloads(t.role)
        }
        writes, dwpd = self._nvme_writes(rate, shares)
        row = Row(
            concurrency=c,
            kv_demand_bytes=demand,
            hbm_kv_bytes=hbm,
            spill_bytes=spill,
            unplaced_bytes=rest,
            hbm_share=hbm / demand,
            max_context_in_hbm=cap.kv_pool_tokens // c,
            running_batch=batch,
            wait_s_per_request=wait,
            gpu_s_per_request=gpu,
            ttft_s=ttft,
            request_rate=rate,
            closed_loop=closed,
            gpu_busy=rate * (gpu + wait),
            gpu_wait_fraction=min(1.0, rate * wait),
            link_utilization=link_util,
            tier_read_utilization=tier_util,
            nvme_write_bytes_per_s=writes,
            nvme_drive_writes_per_day=dwpd,
        )
        row.flags = self._flags(row)
        return row

    def _nvme_writes(
        self, rate: float, shares: dict[str, float]
    ) -> tuple[float | None, float | None]:
        nvme = next((t for t in self.req.tiers if t.role == "nvme"), None)
        if nvme is None:
            return None, None
        new_bytes = (self.new + self.req.output_tokens) * self.cap.kv_bytes_per_token_total
        share = 1.0 if self.req.nvme_writes == "through" else shares["nvme"]
        writes = rate * share * new_bytes / nvme.codec_ratio
        if not nvme.capacity_bytes:
            return writes, None
        return writes, writes * _DAY / nvme.capacity_bytes

    def _flags(self, row: Row) -> list[str]:
        flags = []
        if row.hbm_share < 1:
            flags.append("spills")
        for t in self.req.tiers:
            if row.spill_bytes[t.role] > 0 and not self.reloads(t.role) and self.prefix:
                flags.append(f"{t.role}: recompute")
        if row.unplaced_bytes > 0:
            flags.append("tiers full")
        if row.link_utilization > 1 or any(u > 1 for u in row.tier_read_utilization.values()):
            flags.append("link saturated")
        if row.gpu_busy > 1 and not row.closed_loop:
            flags.append("over capacity")
        if row.gpu_wait_fraction >= WAIT_WARNING:
            flags.append("GPU waits")
        rated = self._nvme_rating()
        if rated is not None and (row.nvme_drive_writes_per_day or 0) > rated:
            flags.append("NVMe wear")
        return flags

    def _nvme_rating(self) -> float | None:
        nvme = next((t for t in self.req.tiers if t.role == "nvme"), None)
        return nvme.storage.dwpd if nvme else None


def _concurrencies(planner: _Planner) -> list[int]:
    req = planner.req
    values = set(req.concurrency)
    if req.add_breakpoints and len(values) > 1:
        lo, hi = min(values), max(values)
        points = [planner.cap.max_concurrency, planner.cap.overflow_concurrency]
        points += [planner.full_at(i) for i in range(len(req.tiers))]
        values.update(p for p in points if p is not None and lo <= p <= hi)
    return sorted(values)


def _events(planner: _Planner, rows: list[Row]) -> list[Event]:
    req, cap = planner.req, planner.cap
    hi = max(r.concurrency for r in rows)
    scan = [planner.row(c) for c in range(1, hi + 1)] if hi <= _SCAN_LIMIT else None
    events: list[Event] = []
    over = cap.overflow_concurrency
    if over <= hi:
        events.append(
            Event(
                over,
                "hbm-overflow",
                f"KV overflows HBM at concurrency {over}: {cap.max_concurrency} requests of "
                f"{req.context:,} tokens ({gb(cap.kv_bytes_per_request_per_gpu)} each per GPU) "
                f"fill the {gb(cap.kv_pool_bytes_per_gpu)} KV pool per GPU",
            )
        )
    for i, tier in enumerate(req.tiers):
        full = planner.full_at(i)
        if full is not None and full <= hi:
            nxt = req.tiers[i + 1].role if i + 1 < len(req.tiers) else None
            tail = f"spill continues to {nxt}" if nxt else "the excess is dropped and recomputed"
            events.append(
                Event(
                    full,
                    f"{tier.role}-full",
                    f"{tier.role} tier ({gb(tier.capacity_bytes)}) "
                    f"is full at concurrency {full}; {tail}",
                )
            )
        first_use = planner.full_at(i - 1) if i else over
        if (
            first_use is not None
            and first_use <= hi
            and planner.prefix
            and not planner.reloads(tier.role)
        ):
            events.append(
                Event(
                    first_use,
                    f"{tier.role}-slower-than-recompute",
                    f"from concurrency {first_use}, prefixes spilled to {tier.role} are "
                    f"recomputed: reloading {planner.prefix:,} tokens takes "
                    f"{planner.reload_prefix[tier.role]:.2f} s vs {planner.recompute_prefix:.2f} s "
                    "to recompute",
                )
            )

    def first(rows_: list[Row], test) -> Row | None:
        return next((r for r in rows_ if test(r)), None)

    candidates = scan if scan is not None else rows
    checks = [
        (
            "link-saturated",
            lambda r: r.link_utilization > 1,
            lambda r: (
                f"at {r.request_rate:g} req/s the host link would need "
                f"{r.link_utilization:.0%} of its {gb(req.link.achieved_bandwidth)}/s from "
                f"concurrency {r.concurrency}"
            ),
        ),
        (
            "tier-saturated",
            lambda r: any(u > 1 for u in r.tier_read_utilization.values()),
            lambda r: (
                "reads from "
                + ", ".join(f"{k} ({u:.0%})" for k, u in r.tier_read_utilization.items() if u > 1)
                + f" exceed the medium's bandwidth from concurrency {r.concurrency}"
            ),
        ),
        (
            "over-capacity",
            lambda r: not r.closed_loop and r.gpu_busy > 1,
            lambda r: (
                f"at {r.request_rate:g} req/s the GPUs need {r.gpu_busy:.0%} of their time "
                f"from concurrency {r.concurrency}"
            ),
        ),
        (
            "gpu-waits",
            lambda r: r.gpu_wait_fraction >= WAIT_WARNING,
            lambda r: (
                f"GPUs wait for KV {r.gpu_wait_fraction:.0%} of the time from concurrency "
                f"{r.concurrency} (reloads {r.wait_s_per_request:.2f} s per request)"
            ),
        ),
        (
            "nvme-wear",
            lambda r: (
                (planner._nvme_rating() is not None)
                and (r.nvme_drive_writes_per_day or 0) > planner._nvme_rating()
            ),
            lambda r: (
                f"NVMe writes {(r.nvme_write_bytes_per_s or 0) * _DAY / 1e12:.1f} TB/day = "
                f"{r.nvme_drive_writes_per_day:.1f} drive writes/day, above its rated "
                f"{planner._nvme_rating():g} DWPD, from concurrency {r.concurrency}"
            ),
        ),
    ]
    for kind, test, say in checks:
        hit = first(candidates, test)
        if hit is not None:
            events.append(Event(hit.concurrency, kind, say(hit)))
    events.sort(key=lambda e: e.concurrency)
    return events


def _warnings(planner: _Planner) -> list[str]:
    req, cap = planner.req, planner.cap
    out = []
    dram = next((t for t in req.tiers if t.role == "dram"), None)
    if dram is not None and dram.raw_capacity() < cap.kv_pool_bytes_total:
        out.append(
            f"the DRAM tier ({gb(dram.capacity_bytes)}) is smaller than the GPU KV pool "
            f"({gb(cap.kv_pool_bytes_total)}): blocks evicted from HBM churn through DRAM; give "
            "DRAM at least the pool's size"
        )
    if cap.max_concurrency == 0:
        out.append(
            f"one request of {req.context:,} tokens needs {gb(cap.kv_bytes_per_request_per_gpu)} "
            f"of KV per GPU but the pool holds {gb(cap.kv_pool_bytes_per_gpu)}: the longest "
            f"context that fits is {cap.kv_pool_tokens:,} tokens"
        )
    if req.context > req.model.max_context:
        out.append(
            f"{req.context:,} tokens is beyond {req.model.name}'s native context of "
            f"{req.model.max_context:,}"
        )
    return out


def _notes(planner: _Planner) -> list[str]:
    req, cap = planner.req, planner.cap
    reserve = []
    if req.reserve_fraction:
        reserve.append(f"{req.reserve_fraction:.0%} of HBM")
    if req.reserve_bytes:
        reserve.append(gb(req.reserve_bytes))
    notes = [
        f"runtime reserve {' + '.join(reserve) or '0'} per GPU "
        f"({gb(cap.reserve_bytes_per_gpu)}) for CUDA context, workspaces, CUDA graphs, "
        "activations and fragmentation (--reserve)",
        f"each request reuses a {planner.prefix:,}-token prefix ({req.prefix_reuse:.0%}) and "
        f"computes {planner.new:,} new tokens + {req.output_tokens} output tokens",
        f"compute: {req.gpu.name} at MFU {req.mfu:g} (prefill), MBU {req.mbu:g} (decode); "
        f"host link {req.link.name} at {gb(req.link.achieved_bandwidth)}/s per GPU",
    ]
    if req.request_rate is None:
        notes.append("no --rate: request rates are the GPUs' closed-loop throughput")
    notes.append(
        "NVMe writes: "
        + (
            "every request's new KV (write-through)"
            if req.nvme_writes == "through"
            else "new KV of sessions living on NVMe (spill)"
        )
    )
    return notes


def _tier_reports(planner: _Planner) -> list[TierReport]:
    req = planner.req
    lengths = req.prefix_lengths or default_prefix_lengths(req.context)
    max_tokens = max(4 * req.context, 1 << 20)
    out = []
    for i, tier in enumerate(req.tiers):
        path = planner.paths[tier.role]
        out.append(
            TierReport(
                role=tier.role,
                medium=tier.storage.name,
                capacity_bytes=tier.capacity_bytes,
                codec_ratio=tier.codec_ratio,
                latency_s=path.latency_s,
                request_s=path.request_s,
                reload_bandwidth_per_gpu=path.bandwidth,
                break_even_tokens=planner.cost.break_even_tokens(path, max_tokens),
                prefix_reload_s=planner.reload_prefix[tier.role],
                prefix_recompute_s=planner.recompute_prefix,
                reload_wins=planner.reloads(tier.role),
                full_at_concurrency=planner.full_at(i),
                rated_dwpd=tier.storage.dwpd,
                comparisons=planner.cost.compare(path, lengths),
            )
        )
    return out


def _inputs(req: PlanRequest, planner: _Planner) -> dict:
    m = req.model
    return {
        "model": m.name,
        "attention": m.attention,
        "kv_dtype": m.kv_dtype,
        "weight_dtype": m.weight_dtype,
        "gpu": req.gpu.name,
        "gpus": req.gpus,
        "link": req.link.name,
        "context": req.context,
        "concurrency": list(req.concurrency),
        "prefix_reuse": req.prefix_reuse,
        "prefix_tokens": planner.prefix,
        "new_tokens": planner.new,
        "output_tokens": req.output_tokens,
        "request_rate": req.request_rate,
        "reserve_fraction": req.reserve_fraction,
        "reserve_bytes": req.reserve_bytes,
        "mfu": req.mfu,
        "mbu": req.mbu,
        "nvme_writes": req.nvme_writes,
        "tiers": [
            {
                "role": t.role,
                "medium": t.storage.name,
                "capacity_bytes": t.capacity_bytes,
                "codec_ratio": t.codec_ratio,
            }
            for t in req.tiers
        ],
    }


def plan(req: PlanRequest) -> Plan:
    """Plan the memory wall for one request; raises ConfigError/SpecError on impossible input."""
    planner = _Planner(req)
    rows = [planner.row(c) for c in _concurrencies(planner)]
    return Plan(
        inputs=_inputs(req, planner),
        capacity=planner.cap,
        tiers=_tier_reports(planner),
        rows=rows,
        events=_events(planner, rows),
        warnings=_warnings(planner),
        notes=_notes(planner),
    )


def request_ttft(
    req: PlanRequest, prompt_tokens: int, cached_tokens: int = 0, tier: str | None = None
) -> float:
    """Seconds to the first token of one request alone on the GPU(s) of ``req``.

    The request has ``prompt_tokens`` tokens whose first ``cached_tokens`` are held in ``tier``:
    a role of ``req.tiers`` (reloaded over that tier's path, or recomputed where the reload
    loses), ``"hbm"`` (already in the GPU's cache) or None (held nowhere: the whole prompt is
    computed). The same figure the planner's rows average (see :class:`Row`). ``req.context``
    and ``req.prefix_reuse`` play no part.
    """
    return _Planner(req).ttft_of(prompt_tokens, cached_tokens, tier)


def reload_curves(req: PlanRequest, lengths: list[int]) -> dict[str, list[Comparison]]:
    """Recompute vs reload per tier at many prefix lengths (for plots)."""
    planner = _Planner(req)
    return {role: planner.cost.compare(path, lengths) for role, path in planner.paths.items()}
