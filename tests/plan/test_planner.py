"""The planner: HBM overflows exactly where (HBM − weights − reserve) / KV per request says."""

import json
import math

import pytest

from kvtier.cost import CostModel, RooflineCompute, TransferPath
from kvtier.errors import ConfigError, SpecError
from kvtier.plan import PlanRequest, SpillTier, default_prefix_lengths, plan
from kvtier.specs import get_gpu, get_link, get_model, get_storage

H100 = get_gpu("h100")
PCIE5 = get_link("pcie-gen5-x16")
CTX = 131_072


def tiers(dram=256e9, nvme=3.84e12, shared=None):
    out = []
    if dram:
        out.append(SpillTier("dram", get_storage("dram"), dram))
    if nvme:
        out.append(SpillTier("nvme", get_storage("nvme-gen4"), nvme))
    if shared:
        out.append(SpillTier("shared", get_storage(shared[0]), shared[1]))
    return tuple(out)


def request(model="llama-3.1-8b", gpus=1, **kw):
    kw.setdefault("tiers", tiers())
    return PlanRequest(get_model(model), H100, PCIE5, gpus=gpus, **kw)


def expected_overflow(model: str, gpus: int, reserve_fraction=0.10, reserve_bytes=0.0):
    """First concurrency that does not fit: floor((HBM − weights − reserve) / KV per req) + 1."""
    m = get_model(model)
    hbm = 80e9
    weights = m.total_params * 2 / gpus  # bf16
    per_request = CTX * m.kv_bytes_per_token() / gpus  # KV heads split over the ranks
    return math.floor((hbm - weights - hbm * reserve_fraction - reserve_bytes) / per_request) + 1


@pytest.mark.parametrize(
    ("model", "gpus", "overflow"), [("llama-3.1-8b", 1, 4), ("llama-3.1-70b", 4, 4)]
)
def test_hbm_overflows_where_the_budget_says(model, gpus, overflow):
    assert expected_overflow(model, gpus) == overflow
    result = plan(request(model, gpus, context=CTX, concurrency=(1, 2, 4, 8, 16, 32, 64)))
    cap = result.capacity
    assert cap.overflow_concurrency == overflow and cap.max_concurrency == overflow - 1
    rows = {r.concurrency: r for r in result.rows}
    assert overflow - 1 in rows and overflow in rows  # exact points added to the range
    assert rows[overflow - 1].hbm_share == 1 and sum(rows[overflow - 1].spill_bytes.values()) == 0
    assert rows[overflow].hbm_share < 1 and rows[overflow].spill_bytes["dram"] > 0
    assert rows[overflow - 1].max_context_in_hbm >= CTX > rows[overflow].max_context_in_hbm
    first = result.events[0]
    assert (first.kind, first.concurrency) == ("hbm-overflow", overflow)


@pytest.mark.parametrize(
    ("reserve_fraction", "reserve_bytes"), [(0.0, 0.0), (0.05, 0.0), (0.0, 20e9), (0.1, 5e9)]
)
def test_overflow_follows_the_stated_reserve(reserve_fraction, reserve_bytes):
    for model, gpus in (("llama-3.1-8b", 1), ("llama-3.1-70b", 4)):
        result = plan(
            request(
                model,
                gpus,
                context=CTX,
                reserve_fraction=reserve_fraction,
                reserve_bytes=reserve_bytes,
            )
        )
        want = expected_overflow(model, gpus, reserve_fraction, reserve_bytes)
        assert result.capacity.overflow_concurrency == want
        reserve = 80e9 * reserve_fraction + reserve_bytes
        assert result.capacity.reserve_bytes_per_gpu == pytest.approx(reserve)


def test_memory_budget_figures():
    cap = plan(request("llama-3.1-70b", 4, context=CTX)).capacity
    assert cap.weights_bytes_per_gpu == pytest.approx(70.6e9 * 2 / 4)
    assert cap.kv_bytes_per_token_per_gpu == 81_920
    assert cap.kv_bytes_per_token_total == 327_680
    assert cap.kv_bytes_per_request_total == 327_680 * CTX
    assert cap.kv_pool_bytes_per_gpu == pytest.approx(80e9 - 35.3e9 - 8e9)


def test_spill_fills_tiers_in_order_and_adds_up():
    result = plan(request(tiers=tiers(dram=100e9, nvme=200e9), concurrency=(1, 64)))
    per_req = result.capacity.kv_bytes_per_request_total
    pool = result.capacity.kv_pool_bytes_total
    for r in result.rows:
        assert r.kv_demand_bytes == r.concurrency * per_req
        total = r.hbm_kv_bytes + sum(r.spill_bytes.values()) + r.unplaced_bytes
        assert total == pytest.approx(r.kv_demand_bytes)
    full = {t.role: t.full_at_concurrency for t in result.tiers}
    assert full["dram"] == math.floor((pool + 100e9) / per_req) + 1
    assert full["nvme"] == math.floor((pool + 300e9) / per_req) + 1
    last = result.rows[-1]
    assert last.spill_bytes == {"dram": 100e9, "nvme": 200e9}
    assert last.unplaced_bytes > 0 and "tiers full" in last.flags
    kinds = [e.kind for e in result.events]
    assert kinds.index("hbm-overflow") < kinds.index("dram-full") < kinds.index("nvme-full")
    assert {full["dram"], full["nvme"]} <= {r.concurrency for r in result.rows}


def test_tier_reports_agree_with_the_cost_model():
    result = plan(request(tiers=tiers(shared=("redis", None))))
    m = get_model("llama-3.1-8b")
    cost = CostModel(RooflineCompute(m, H100), m.kv_bytes_per_token())
    for t in result.tiers:
        path = TransferPath.from_specs(get_storage(t.medium), PCIE5, model=m)
        assert t.break_even_tokens == cost.break_even_tokens(path, 4 * CTX)
        assert [c.tokens for c in t.comparisons] == list(default_prefix_lengths(CTX))
        assert t.comparisons[-1].reload_s == pytest.approx(cost.reload_seconds(path, CTX))
    redis = result.tiers[-1]
    assert redis.capacity_bytes is None and redis.full_at_concurrency is None
    assert redis.break_even_tokens > result.tiers[0].break_even_tokens


def test_a_slow_tier_below_break_even_is_recomputed():
    # 8k context with half reused: a 4k prefix, far below Redis's break-even.
    result = plan(
        request(
            context=8192,
            prefix_reuse=0.5,
            concurrency=(1, 4096),
            tiers=(
                SpillTier("dram", get_storage("dram"), 10e9),
                SpillTier("shared", get_storage("redis"), None),
            ),
        )
    )
    redis = next(t for t in result.tiers if t.role == "shared")
    assert not redis.reload_wins and redis.prefix_reload_s >= redis.prefix_recompute_s
    assert any(e.kind == "shared-slower-than-recompute" for e in result.events)
    assert "shared: recompute" in result.rows[-1].flags
    assert result.rows[-1].tier_read_utilization.get("shared") is None


def test_wait_is_zero_until_overflow_then_grows():
    result = plan(request(concurrency=(1, 2, 3, 4, 8, 16, 32, 64)))
    fit = result.capacity.max_concurrency
    waits = {r.concurrency: r.gpu_wait_fraction for r in result.rows}
    assert all(waits[c] == 0 for c in waits if c <= fit)
    assert waits[64] > waits[fit + 1] > 0
    for r in result.rows:  # closed loop: the GPUs are exactly busy
        assert r.closed_loop and r.gpu_busy == pytest.approx(1.0)


def test_request_rate_saturates_link_and_gpu():
    result = plan(request(concurrency=(1, 64), request_rate=50.0))
    kinds = {e.kind for e in result.events}
    assert {"over-capacity", "link-saturated"} <= kinds
    assert result.rows[-1].link_utilization > 1 and result.rows[-1].gpu_busy > 1
    calm = plan(request(concurrency=(1, 64), request_rate=0.01))
    assert not {"over-capacity", "link-saturated"} & {e.kind for e in calm.events}


def test_nvme_writes_through_exceed_spill_and_hit_endurance():
    spill = plan(request(concurrency=(1, 64)))
    through = plan(request(concurrency=(1, 64), nvme_writes="through"))
    assert spill.rows[0].nvme_write_bytes_per_s == 0
    assert through.rows[0].nvme_write_bytes_per_s > 0
    for a, b in zip(spill.rows, through.rows, strict=True):
        assert b.nvme_write_bytes_per_s >= a.nvme_write_bytes_per_s
        assert b.nvme_drive_writes_per_day == pytest.approx(
            b.nvme_write_bytes_per_s * 86_400 / 3.84e12
        )
    assert any(e.kind == "nvme-wear" for e in through.events)


def test_small_dram_is_flagged_as_churn():
    result = plan(request(tiers=tiers(dram=32e9)))
    assert any("smaller than the GPU KV pool" in w for w in result.warnings)
    assert not plan(request()).warnings


def test_context_beyond_the_pool_is_a_warning_not_an_error():
    result = plan(request(context=1 << 20, concurrency=(1,)))
    assert result.capacity.max_concurrency == 0 and result.capacity.overflow_concurrency == 1
    assert any("longest context that fits" in w for w in result.warnings)
    assert any("native context" in w for w in result.warnings)


def test_no_tiers_drops_everything_beyond_hbm():
    result = plan(request(tiers=(), concurrency=(8,)))
    assert result.tiers == [] and result.rows[0].unplaced_bytes > 0
    assert result.rows[0].nvme_write_bytes_per_s is None


def test_plan_is_plain_json():
    result = plan(request("llama-3.1-70b", 4, tiers=tiers(shared=("redis", None))))
    text = json.dumps(result.to_dict(), allow_nan=False)
    data = json.loads(text)
    assert data["capacity"]["overflow_concurrency"] == 4
    assert data["tiers"][-1]["capacity_bytes"] is None


def test_weights_that_do_not_fit_name_the_problem():
    with pytest.raises(SpecError, match="more --gpus"):
        plan(request("llama-3.1-405b", 1))
    fp8 = get_model("llama-3.1-405b", weight_dtype="fp8")
    assert plan(PlanRequest(fp8, H100, PCIE5, gpus=8, context=8192)).capacity.max_concurrency > 0


@pytest.mark.parametrize(
    "kw",
    [
        {"gpus": 3},
        {"gpus": 0},
        {"context": 0},
        {"concurrency": (0, 4)},
        {"prefix_reuse": 1.5},
        {"output_tokens": -1},
        {"request_rate": 0.0},
        {"reserve_fraction": 1.0},
        {"prefix_lengths": (0,)},
        {"mfu": 0.0},
    ],
)
def test_impossible_numbers_raise_config_errors(kw):
    with pytest.raises(ConfigError):
        plan(request(**kw))


def test_mla_and_moe_plan():
    ds = PlanRequest(get_model("deepseek-v3", weight_dtype="fp8"), get_gpu("h200"), PCIE5, gpus=8)
    cap = plan(ds).capacity
    assert cap.kv_bytes_per_token_per_gpu == 70_272  # latent replicated on every rank
    assert cap.weights_bytes_per_gpu == pytest.approx(671e9 / 8)
