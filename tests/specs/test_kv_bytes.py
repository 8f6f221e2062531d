"""KV bytes per token: the published figures, the MLA formula and tensor-parallel division."""

import pytest

from kvtier.errors import SpecError
from kvtier.specs import MODELS, GiB, ModelSpec, get_model


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama-3.1-8b", 131_072),
        ("llama-3.1-70b", 327_680),
        ("llama-3.1-405b", 516_096),
        ("deepseek-v3", 70_272),
        ("smollm2-135m", 23_040),
    ],
)
def test_known_kv_bytes_per_token(name, expected):
    assert get_model(name).kv_bytes_per_token() == expected


def test_llama3_8b_at_a_million_tokens_is_128_gib():
    assert get_model("llama-3-8b").kv_bytes_per_token() * 1_048_576 == 128 * GiB


def test_gqa_formula():
    m = ModelSpec("toy", layers=10, attention_heads=16, kv_heads=4, head_dim=96, total_params=1e9)
    assert m.kv_bytes_per_token() == 2 * 10 * 4 * 96 * 2


def test_mla_formula_is_layers_times_latent_plus_rope():
    m = ModelSpec("toy-mla", 27, 16, 16, 128, 16e9, attention="mla", kv_lora_rank=512, rope_dim=64)
    assert m.kv_bytes_per_token() == 27 * (512 + 64) * 2
    assert m.with_dtypes(kv="fp8").kv_bytes_per_token() == 27 * (512 + 64) * 1
    with pytest.raises(SpecError):
        ModelSpec("bad-mla", 2, 4, 4, 64, 1e9, attention="mla")


def test_kv_dtype_scales_and_is_a_parameter():
    assert get_model("llama-3.1-8b", kv_dtype="fp8").kv_bytes_per_token() == 65_536
    assert get_model("llama-3.1-8b", kv_dtype="fp16").kv_bytes_per_token() == 131_072
    with pytest.raises(SpecError, match="unknown dtype"):
        get_model("llama-3.1-8b", kv_dtype="fp7")


def test_weight_dtype_is_a_parameter():
    m = get_model("llama-3.1-70b")
    assert m.weight_bytes() == pytest.approx(70.6e9 * 2)
    assert get_model("llama-3.1-70b", weight_dtype="fp8").weight_bytes() == pytest.approx(70.6e9)
    assert get_model("llama-3.1-70b", weight_dtype="int4").weight_bytes(tp=4) == pytest.approx(
        70.6e9 / 8
    )


def test_tensor_parallel_divides_kv_heads():
    m = get_model("llama-3.1-70b")
    assert m.kv_bytes_per_token(tp=4) == 327_680 // 4
    assert m.kv_bytes_per_token(tp=8) == 327_680 // 8
    # more ranks than KV heads: each rank keeps one replicated head
    assert m.kv_bytes_per_token(tp=16) == 327_680 // 8
    assert m.kv_bytes_total_per_token(tp=4) == 327_680


def test_mla_latent_is_replicated_across_ranks():
    ds = get_model("deepseek-v3")
    assert ds.kv_bytes_per_token(tp=8) == 70_272
    with pytest.raises(SpecError):
        ds.kv_bytes_per_token(tp=0)


def test_moe_params():
    ds = get_model("deepseek-v3")
    assert ds.is_moe and ds.params_per_token == 37e9 and ds.total_params == 671e9
    assert not get_model("llama-3.1-8b").is_moe


def test_unknown_model_lists_the_presets():
    with pytest.raises(SpecError) as err:
        get_model("gpt-17")
    message = str(err.value)
    assert "gpt-17" in message and "llama-3.1-8b" in message and "\n" not in message


def test_aliases_and_case():
    assert get_model("Llama-3.1-8B") == MODELS["llama-3.1-8b"]
    assert get_model("llama-70b").name == "llama-3.1-70b"
