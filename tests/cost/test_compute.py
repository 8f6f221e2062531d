"""Roofline prefill/decode times follow the stated FLOP and byte counts."""

import pytest

from kvtier.cost import ComputeModel, RooflineCompute
from kvtier.errors import ConfigError
from kvtier.specs import get_gpu, get_model

H100 = get_gpu("h100")
LLAMA8 = get_model("llama-3.1-8b")


def test_prefill_flops_are_linear_plus_causal_attention():
    c = RooflineCompute(LLAMA8, H100)
    n, p = 1000, 500
    linear = 2 * 8.03e9 * n
    attention = 2 * 32 * 32 * (128 + 128) * n * (p + (n + 1) / 2)
    assert c.prefill_flops(n, p) == pytest.approx(linear + attention, rel=1e-12)
    assert c.prefill_seconds(n, p) == pytest.approx((linear + attention) / (989e12 * 0.5))


def test_prefill_splits_exactly_at_any_cached_prefix():
    """prefill(P+S) from scratch == prefill(P) + prefill(S after P): reload replaces prefill(P)."""
    c = RooflineCompute(LLAMA8, H100)
    for p, s in [(1, 1), (4096, 100), (100_000, 31_072)]:
        assert c.prefill_seconds(p + s) == pytest.approx(
            c.prefill_seconds(p) + c.prefill_seconds(s, p)
        )


def test_prefill_grows_with_cached_context_and_is_zero_for_nothing():
    c = RooflineCompute(LLAMA8, H100)
    assert c.prefill_seconds(0, 10_000) == 0.0
    times = [c.prefill_seconds(512, p) for p in (0, 1024, 32_768, 131_072)]
    assert times == sorted(times) and times[0] < times[-1]


def test_tensor_parallel_and_mfu_scale_prefill():
    base = RooflineCompute(LLAMA8, H100).prefill_seconds(8192)
    assert RooflineCompute(LLAMA8, H100, tp=4).prefill_seconds(8192) == pytest.approx(base / 4)
    assert RooflineCompute(LLAMA8, H100, mfu=0.25).prefill_seconds(8192) == pytest.approx(base * 2)


def test_moe_uses_active_params_and_mla_its_wider_query_key():
    ds = get_model("deepseek-v3")
    c = RooflineCompute(ds, H100)
    linear = 2 * 37e9 * 10
    attention = 2 * 61 * 128 * ((128 + 64) + 128) * 10 * (0 + 11 / 2)
    assert c.prefill_flops(10) == pytest.approx(linear + attention)


def test_decode_is_a_memory_bound_read_of_weights_and_kv():
    c = RooflineCompute(LLAMA8, H100, mbu=0.8)
    expected = (8.03e9 * 2 + 4 * 65_536 * 131_072) / (3.35e12 * 0.8)
    assert c.decode_step_seconds(65_536, batch=4) == pytest.approx(expected)
    assert c.decode_step_seconds(1024) < c.decode_step_seconds(131_072)
    assert c.decode_step_seconds(1024, 0) == 0.0


def test_decode_never_beats_its_flops():
    c = RooflineCompute(LLAMA8, H100)
    batch = 4096
    assert c.decode_step_seconds(16, batch) >= batch * c.prefill_flops(1, 16) / c.flops_per_second


def test_roofline_satisfies_the_protocol_and_rejects_bad_numbers():
    assert isinstance(RooflineCompute(LLAMA8, H100), ComputeModel)
    for kwargs in ({"mfu": 0}, {"mfu": 1.5}, {"mbu": -1}, {"tp": 0}):
        with pytest.raises(ConfigError):
            RooflineCompute(LLAMA8, H100, **kwargs)
    with pytest.raises(ConfigError):
        RooflineCompute(LLAMA8, H100).prefill_seconds(-1)
