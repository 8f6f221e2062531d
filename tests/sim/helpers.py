"""Small simulations the sim tests share: a CPU-like measured engine and tiny workloads."""

from __future__ import annotations

from kvtier.sim.config import EngineSpec, KvtierSpec, SimConfig
from kvtier.sim.tiers import TierSpec
from kvtier.sim.timing import MeasuredTimer
from kvtier.workloads.requests import TraceRequest, chain_keys

BLOCK = 16
KV_PER_TOKEN = 1000.0
TIMER = MeasuredTimer(step_s=0.01, token_s=1e-4, request_overhead_s=0.0, budget=256)


def engine(blocks: int = 64, **kw) -> EngineSpec:
    return EngineSpec(
        pool_blocks=blocks, block_tokens=BLOCK, kv_bytes_per_token=KV_PER_TOKEN,
        max_batched_tokens=256, **kw,
    )  # fmt: skip


def dram(capacity: float | None = 1e9, **kw) -> TierSpec:
    return TierSpec("dram", 10e9, 10e9, 1e-6, capacity_bytes=capacity, **kw)


def disk(capacity: float | None = 1e10, **kw) -> TierSpec:
    return TierSpec("disk", 1e8, 1e8, 1e-4, capacity_bytes=capacity, **kw)


def kvtier(*tiers: TierSpec, **kw) -> KvtierSpec:
    return KvtierSpec(tiers=tiers or (dram(),), chunk_tokens=2 * BLOCK, **kw)


def config(**kw) -> SimConfig:
    kw.setdefault("engine", engine())
    kw.setdefault("timer", TIMER)
    return SimConfig(**kw)


def request(
    at: float,
    tokens: int,
    out: int = 4,
    ids=None,
    session=None,
    turn=0,
    after=None,
    tag: str = "",
) -> TraceRequest:
    """A request whose blocks are named ``ids`` (default: its own, shared with no request of
    another ``tag``, time or length)."""
    if ids is None:
        ids = [f"own-{tag}-{at}-{tokens}-{i}" for i in range(-(-tokens // BLOCK))]
    return TraceRequest(
        arrival_s=at, input_tokens=tokens, output_tokens=out,
        blocks=chain_keys(ids[: -(-tokens // BLOCK)]), block_tokens=BLOCK,
        session=session, turn=turn, after_s=after,
    )  # fmt: skip


def shared_prefix(at: float, tokens: int, prefix_blocks: int, tag: str, out: int = 4):
    """A request whose first ``prefix_blocks`` blocks are a prefix every such request shares."""
    own = [f"{tag}-{i}" for i in range(-(-tokens // BLOCK) - prefix_blocks)]
    return request(at, tokens, out, [f"p{i}" for i in range(prefix_blocks)] + own)
