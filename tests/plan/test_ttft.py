"""Plan's time to first token: the prefix's wait + the prefill of the rest (it samples)."""

import pytest

from kvtier.cost import CostModel, RooflineCompute, TransferPath
from kvtier.errors import ConfigError
from kvtier.plan import PlanRequest, SpillTier, plan, request_ttft
from kvtier.specs import get_gpu, get_link, get_model, get_storage

H100, PCIE5 = get_gpu("h100"), get_link("pcie-gen5-x16")
MODEL = get_model("llama-3.1-8b")
COMPUTE = RooflineCompute(MODEL, H100)
COST = CostModel(COMPUTE, MODEL.kv_bytes_per_token())
TIERS = (
    SpillTier("dram", get_storage("dram"), 100e9),
    SpillTier("shared", get_storage("object-store"), None),
)


def request(**kw) -> PlanRequest:
    return PlanRequest(MODEL, H100, PCIE5, tiers=TIERS, **kw)


def path(medium: str) -> TransferPath:
    return TransferPath.from_specs(get_storage(medium), PCIE5, model=MODEL)


def test_ttft_adds_the_prefix_wait_and_the_rest_of_the_prefill():
    req, n, p = request(), 32_768, 30_000
    rest = COMPUTE.prefill_seconds(n - p, p)
    assert request_ttft(req, n, p, "hbm") == pytest.approx(rest)
    assert request_ttft(req, n, p, None) == pytest.approx(COMPUTE.prefill_seconds(n))
    reload = COST.reload_seconds(path("dram"), p)
    assert reload < COST.recompute_seconds(p)
    assert request_ttft(req, n, p, "dram") == pytest.approx(reload + rest)


def test_a_reload_that_loses_is_recomputed():
    req, n, p = request(), 2048, 1024  # 1k tokens are far below the object store's break-even
    assert not COST.reload_wins(path("object-store"), p)
    assert request_ttft(req, n, p, "shared") == pytest.approx(request_ttft(req, n, p, None))


def test_row_ttft_weighs_each_place_by_its_share():
    req = request(context=131_072, concurrency=(1, 8))
    rows = {r.concurrency: r for r in plan(req).rows}
    prefix = plan(req).inputs["prefix_tokens"]
    assert rows[1].ttft_s == pytest.approx(request_ttft(req, 131_072, prefix, "hbm"))
    row = rows[8]
    assert row.spill_bytes["dram"] > 0 and row.hbm_share < 1
    assert rows[1].ttft_s < row.ttft_s
    assert "ttft_s" in plan(req).to_dict()["rows"][0]


def test_bad_ttft_questions_are_refused():
    with pytest.raises(ConfigError):
        request_ttft(request(), 100, 100, "hbm")
    with pytest.raises(ConfigError):
        request_ttft(request(), 100, 10, "nvme")
    with pytest.raises(ConfigError):
        request_ttft(request(), 0)
