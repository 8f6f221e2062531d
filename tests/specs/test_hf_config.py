"""ModelSpec from a HuggingFace config.json, and clear errors for malformed ones."""

import json

import pytest

from kvtier.errors import SpecError
from kvtier.specs import get_model, model_from_hf_config

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}

DEEPSEEK_V3 = {
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "first_k_dense_replace": 3,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "vocab_size": 129280,
    "torch_dtype": "bfloat16",
}


def write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return path


def test_llama_config_gives_the_preset_geometry(tmp_path):
    m = model_from_hf_config(write(tmp_path, LLAMA_8B))
    assert (m.layers, m.attention_heads, m.kv_heads, m.head_dim) == (32, 32, 8, 128)
    assert m.attention == "gqa" and m.kv_dtype == "bf16"
    assert m.kv_bytes_per_token() == 131_072
    assert m.total_params == pytest.approx(8.03e9, rel=0.01)


def test_folder_and_get_model_path(tmp_path):
    write(tmp_path, LLAMA_8B)
    assert model_from_hf_config(tmp_path).kv_bytes_per_token() == 131_072
    m = get_model(str(tmp_path / "config.json"), kv_dtype="fp8")
    assert m.kv_bytes_per_token() == 65_536


def test_mla_moe_config(tmp_path):
    m = model_from_hf_config(write(tmp_path, DEEPSEEK_V3))
    assert m.attention == "mla" and m.kv_bytes_per_token() == 70_272
    assert m.is_moe
    assert m.total_params == pytest.approx(671e9, rel=0.01)
    assert m.active_params == pytest.approx(37e9, rel=0.02)


def test_fp16_and_multimodal_text_config(tmp_path):
    cfg = {"text_config": {**LLAMA_8B, "torch_dtype": "float16"}, "model_type": "llava"}
    m = model_from_hf_config(write(tmp_path, cfg))
    assert m.kv_dtype == "fp16" and m.kv_bytes_per_token() == 131_072


def test_head_dim_defaults_to_hidden_over_heads(tmp_path):
    cfg = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    m = model_from_hf_config(write(tmp_path, cfg))
    assert m.attention == "mha" and m.kv_heads == 32 and m.head_dim == 128


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "JSON object"),
        ({"hidden_size": 4096}, "num_hidden_layers"),
        ({**LLAMA_8B, "num_hidden_layers": "many"}, "num_hidden_layers"),
        ({**LLAMA_8B, "num_key_value_heads": "eight"}, "num_key_value_heads"),
        ({**LLAMA_8B, "num_attention_heads": 0}, "num_attention_heads"),
        ({**LLAMA_8B, "num_hidden_layers": -3}, "layers"),
        ({**LLAMA_8B, "num_key_value_heads": 7}, "multiple of KV heads"),
        ({**LLAMA_8B, "vocab_size": None, "intermediate_size": [1]}, "intermediate_size"),
        ({"text_config": "oops"}, "JSON object"),
    ],
)
def test_malformed_configs_raise_one_line_spec_errors(tmp_path, content, needle):
    with pytest.raises(SpecError) as err:
        model_from_hf_config(write(tmp_path, content))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no config file"):
        model_from_hf_config(tmp_path / "absent.json")
    with pytest.raises(SpecError, match="no config file"):
        get_model(str(tmp_path / "absent.json"))
