"""`kvtier plan` and `kvtier simulate` agree where both apply: one request alone, same tiers."""

import pytest

from kvtier.plan import PlanRequest, SpillTier, request_ttft
from kvtier.sim.config import SimConfig
from kvtier.sim.simulator import Simulator
from kvtier.sim.specs import engine_from_specs, kvtier_from_specs, timer_from_specs
from kvtier.specs import get_gpu, get_link, get_model, get_storage
from kvtier.workloads.requests import TraceRequest, chain_keys

MODEL, GPU, LINK = get_model("llama-3.1-8b"), get_gpu("h100"), get_link("pcie-gen5-x16")
CHOICES = [
    SpillTier("dram", get_storage("dram"), 256e9),
    SpillTier("nvme", get_storage("nvme-gen4"), 3.84e12),
    SpillTier("shared", get_storage("redis"), None),
]


def simulated_ttft(prompt: int, cached: int, tier: str | None) -> float:
    engine = engine_from_specs(MODEL, GPU, 1)
    kv = kvtier_from_specs(CHOICES, LINK, 1, model=MODEL, chunk_tokens=256, preload=False)
    config = SimConfig(engine=engine, timer=timer_from_specs(MODEL, GPU, 1), kvtier=kv)
    sim = Simulator(config, [TraceRequest(0.0, prompt, 1, chain_keys(range(prompt // 256)), 256)])
    r, conn = sim.requests[0], sim.replicas[0].connector
    if tier is not None:
        for c in range(cached // 256):
            assert conn.by_name[tier].hold(conn.chunk_key(r, c), conn.chunk_bytes)
    return sim.run().records[0].ttft_s


@pytest.mark.parametrize("tier", [None, "dram", "nvme", "shared"])
@pytest.mark.parametrize(("prompt", "cached"), [(8192, 4096), (32768, 30720), (100_000, 65536)])
def test_one_request_alone_has_the_ttft_plan_gives(prompt, cached, tier):
    req = PlanRequest(
        MODEL,
        GPU,
        LINK,
        tiers=tuple(SpillTier(c.role, c.storage, c.capacity_bytes) for c in CHOICES),
    )
    want = request_ttft(req, prompt, cached, tier)
    assert simulated_ttft(prompt, cached, tier) == pytest.approx(want, rel=0.05)
