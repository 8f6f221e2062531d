"""Model KV geometry: how many bytes of KV each token costs, and how heavy the weights are."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, Self

from kvtier.errors import SpecError

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}
AttentionKind = Literal["mha", "gqa", "mla"]


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``bf16``, ``fp8``, ``int4`` …)."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise SpecError(
            f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}"
        ) from None


@dataclass(frozen=True)
class KVIdentity:
    """Which model's KV, in which dtype and per-rank shape: KV that differs in any of these
    cannot stand in for another. A cache namespace and a calibration profile both start with it.
    """

    model_id: str
    fingerprint: str
    kv_dtype: str
    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, identity: KVIdentity, **more: Any) -> Self:
        """A ``cls`` (an identity with more fields) carrying ``identity`` and ``more``."""
        own = {f.name: getattr(identity, f.name) for f in fields(KVIdentity)}
        return cls(**own, **more)


@dataclass(frozen=True)
class ModelSpec:
    """Geometry of a decoder-only transformer as far as KV memory and prefill compute go.

    ``total_params`` counts every weight (all MoE experts); ``active_params`` those used per token.
    For MLA, the cache holds one latent of ``kv_lora_rank + rope_dim`` values per layer and token.
    """

    name: str
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    total_params: float
    active_params: float | None = None
    attention: AttentionKind = "gqa"
    kv_lora_rank: int = 0
    rope_dim: int = 0
    v_head_dim: int | None = None
    kv_dtype: str = "bf16"
    weight_dtype: str = "bf16"
    max_context: int = 131072

    def __post_init__(self) -> None:
        for field in ("layers", "attention_heads", "kv_heads", "head_dim"):
            if getattr(self, field) <= 0:
                raise SpecError(f"model {self.name!r}: {field} must be positive")
        if self.total_params <= 0:
            raise SpecError(f"model {self.name!r}: total_params must be positive")
        if self.active_params is not None and not 0 < self.active_params <= self.total_params:
            raise SpecError(f"model {self.name!r}: active_params must be in (0, total_params]")
        if self.attention == "mla" and self.kv_lora_rank <= 0:
            raise SpecError(f"model {self.name!r}: MLA needs kv_lora_rank > 0")
        if self.attention_heads % self.kv_heads and self.attention != "mla":
            raise SpecError(f"model {self.name!r}: attention heads must be a multiple of KV heads")
        dtype_bytes(self.kv_dtype)
        dtype_bytes(self.weight_dtype)

    @property
    def params_per_token(self) -> float:
        """Parameters each token passes through (active parameters for MoE)."""
        return self.active_params if self.active_params is not None else self.total_params

    @property
    def is_moe(self) -> bool:
        return self.active_params is not None and self.active_params < self.total_params

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads held by one tensor-parallel rank (heads are replicated when tp > kv_heads)."""
        if tp < 1:
            raise SpecError(f"tensor parallel size must be at least 1, got {tp}")
        return max(1, math.ceil(self.kv_heads / tp))

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV bytes one token occupies on one tensor-parallel rank.

        2 × layers × kv_heads × head_dim × dtype bytes; for MLA layers × (kv_lora_rank + rope_dim)
        × dtype bytes, replicated on every rank.
        """
        size = dtype_bytes(self.kv_dtype)
        per_rank_heads = self.kv_heads_per_rank(tp)  # also checks tp
        if self.attention == "mla":
            return self.layers * (self.kv_lora_rank + self.rope_dim) * size
        return 2 * self.layers * per_rank_heads * self.head_dim * size

    def kv_bytes_total_per_token(self, tp: int = 1) -> float:
        """KV bytes one token occupies summed over all ranks."""
        return self.kv_bytes_per_token(tp) * tp

    def weight_bytes(self, tp: int = 1) -> float:
        """Weight bytes held by one tensor-parallel rank."""
        return self.total_params * dtype_bytes(self.weight_dtype) / tp

    def attention_dims(self) -> tuple[int, int]:
        """(query·key width, value width) of one attention head, for attention FLOPs."""
        if self.attention == "mla":
            return self.head_dim + self.rope_dim, self.v_head_dim or self.head_dim
        return self.head_dim, self.v_head_dim or self.head_dim

    def with_dtypes(self, kv: str | None = None, weights: str | None = None) -> ModelSpec:
        """The same model with another KV and/or weight dtype."""
        return replace(
            self, kv_dtype=kv or self.kv_dtype, weight_dtype=weights or self.weight_dtype
        )


def _gqa(name: str, layers: int, heads: int, kv: int, hd: int, params: float, **kw) -> ModelSpec:
    kind = "mha" if heads == kv else "gqa"
    return ModelSpec(name, layers, heads, kv, hd, params, attention=kind, **kw)


# Geometry from each model's published config.json; parameter counts from its model card.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gqa("llama-3.2-3b", 28, 24, 8, 128, 3.21e9),
        _gqa("llama-3-8b", 32, 32, 8, 128, 8.03e9, max_context=8192),
        _gqa("llama-3.1-8b", 32, 32, 8, 128, 8.03e9),
        _gqa("llama-3.1-70b", 80, 64, 8, 128, 70.6e9),
        _gqa("llama-3.1-405b", 126, 128, 8, 128, 405.9e9),
        _gqa("qwen2.5-7b", 28, 28, 4, 128, 7.62e9),
        _gqa("qwen2.5-32b", 64, 40, 8, 128, 32.8e9),
        _gqa("qwen2.5-72b", 80, 64, 8, 128, 72.7e9),
        _gqa("qwen3-4b", 36, 32, 8, 128, 4.02e9, max_context=32768),
        _gqa("qwen3-14b", 40, 40, 8, 128, 14.8e9, max_context=32768),
        _gqa("qwen3-32b", 64, 64, 8, 128, 32.8e9, max_context=32768),
        _gqa("qwen3-235b-a22b", 94, 64, 4, 128, 235e9, active_params=22e9, max_context=32768),
        _gqa("mistral-7b", 32, 32, 8, 128, 7.25e9, max_context=32768),
        _gqa("mixtral-8x7b", 32, 32, 8, 128, 46.7e9, active_params=12.9e9, max_context=32768),
        ModelSpec(
            "deepseek-v3",
            61,
            128,
            128,
            128,
            671e9,
            active_params=37e9,
            attention="mla",
            kv_lora_rank=512,
            rope_dim=64,
            v_head_dim=128,
        ),
        _gqa("smollm2-135m", 30, 9, 3, 64, 134.5e6, max_context=8192),
    )
}

ALIASES = {
    "llama3-8b": "llama-3-8b",
    "llama-3-8b-instruct": "llama-3-8b",
    "llama-8b": "llama-3.1-8b",
    "llama-70b": "llama-3.1-70b",
    "llama-405b": "llama-3.1-405b",
    "deepseek-r1": "deepseek-v3",
    "smollm2": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
}


def get_model(
    name: str,
    kv_dtype: str | None = None,
    weight_dtype: str | None = None,
    extra: dict[str, ModelSpec] | None = None,
) -> ModelSpec:
    """A preset by name (case-insensitive), a user profile entry, or a path to an HF config.json."""
    key = name.strip().lower()
    pool = {**MODELS, **{k.lower(): v for k, v in (extra or {}).items()}}
    if key in pool or ALIASES.get(key) in pool:
        spec = pool.get(key) or pool[ALIASES[key]]
    elif name.endswith(".json") or Path(name).is_dir():
        spec = model_from_hf_config(name)
    else:
        raise SpecError(
            f"unknown model {name!r}; presets: {', '.join(sorted(pool))} "
            "(or give the path of a HuggingFace config.json)"
        )
    return spec.with_dtypes(kv_dtype, weight_dtype)


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a HuggingFace ``config.json`` (a file, or a folder that holds one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"no config file at {path}") from None
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{path} does not hold a JSON object")
    cfg = cfg.get("text_config", cfg)
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: text_config does not hold a JSON object")
    hidden = _int_field(cfg, path, "hidden_size")
    layers = _int_field(cfg, path, "num_hidden_layers")
    heads = _int_field(cfg, path, "num_attention_heads")
    kv = _int_field(cfg, path, "num_key_value_heads", heads)
    head_dim = _int_field(cfg, path, "head_dim", max(1, hidden // heads))
    total, active = _estimate_params(cfg, path, hidden, layers, heads, kv, head_dim)
    dtype = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(
        str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), "bf16"
    )
    common = dict(
        total_params=total,
        active_params=active if active < total else None,
        kv_dtype=dtype,
        weight_dtype=dtype,
        max_context=_int_field(cfg, path, "max_position_embeddings", 131072),
    )
    label = name or str(cfg.get("_name_or_path") or path.parent.name or "hf-model")
    if cfg.get("kv_lora_rank"):
        return ModelSpec(
            label,
            layers,
            heads,
            heads,
            _int_field(cfg, path, "qk_nope_head_dim", head_dim),
            attention="mla",
            kv_lora_rank=_int_field(cfg, path, "kv_lora_rank"),
            rope_dim=_int_field(cfg, path, "qk_rope_head_dim", 0, positive=False),
            v_head_dim=_int_field(cfg, path, "v_head_dim", head_dim),
            **common,
        )
    return ModelSpec(
        label, layers, heads, kv, head_dim, attention="mha" if kv == heads else "gqa", **common
    )


def _int_field(
    cfg: dict, path: Path, key: str, default: int | None = None, positive: bool = True
) -> int:
    """An integer field of a config; a missing/null one takes ``default`` (None: required)."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise SpecError(f"{path} lacks the field {key!r}; is it a decoder-only LM config?")
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == int(value)
    if not ok or int(value) < (1 if positive else 0):
        kind = "a positive" if positive else "a non-negative"
        raise SpecError(f"{path}: field {key!r} must be {kind} integer, got {value!r}")
    return int(value)


def _estimate_params(
    cfg: dict, path: Path, hidden: int, layers: int, heads: int, kv: int, head_dim: int
) -> tuple[float, float]:
    """(total, active) parameters of a Llama/Qwen/Mixtral/DeepSeek-style config, from its shapes."""
    vocab = _int_field(cfg, path, "vocab_size", 32000)
    inter = _int_field(cfg, path, "intermediate_size", 4 * hidden)
    kv_lora = _int_field(cfg, path, "kv_lora_rank", 0, positive=False)
    if kv_lora:  # MLA: low-rank query (optional) and a shared KV latent
        nope = _int_field(cfg, path, "qk_nope_head_dim", head_dim)
        rope = _int_field(cfg, path, "qk_rope_head_dim", 0, positive=False)
        v_dim = _int_field(cfg, path, "v_head_dim", head_dim)
        q_lora = _int_field(cfg, path, "q_lora_rank", 0, positive=False)
        qk = nope + rope
        q = hidden * q_lora + q_lora * heads * qk if q_lora else hidden * heads * qk
        attn = q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_dim)
        attn += heads * v_dim * hidden
    else:
        attn = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    experts = 0
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        experts = experts or _int_field(cfg, path, key, 0, positive=False)
    dense_mlp = 3 * hidden * inter
    dense_layers = layers
    mlp_total = mlp_active = 0
    if experts:
        per_tok = _int_field(cfg, path, "num_experts_per_tok", 2)
        expert = 3 * hidden * _int_field(cfg, path, "moe_intermediate_size", inter)
        shared = expert * _int_field(cfg, path, "n_shared_experts", 0, positive=False)
        mlp_total, mlp_active = experts * expert + shared, per_tok * expert + shared
        dense_layers = min(layers, _int_field(cfg, path, "first_k_dense_replace", 0, False))
    moe_layers = layers - dense_layers
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    total = embed + layers * attn + dense_layers * dense_mlp + moe_layers * mlp_total
    active = embed + layers * attn + dense_layers * dense_mlp + moe_layers * mlp_active
    return float(total), float(active)
