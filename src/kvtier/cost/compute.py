"""Compute time of prefill and decode: the ``ComputeModel`` contract and a roofline estimate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvtier.errors import ConfigError
from kvtier.specs.hardware import GPU
from kvtier.specs.model import ModelSpec, dtype_bytes

#: Model FLOP utilisation assumed for prefill: large-batch prefill on H100-class GPUs reaches
#: roughly 40-60 % of dense peak in vLLM/SGLang; 0.5 is the middle of that range.
DEFAULT_MFU = 0.5
#: Memory-bandwidth utilisation assumed for decode: well-tuned decode kernels read HBM at
#: roughly 70-90 % of the datasheet rate.
DEFAULT_MBU = 0.8


@runtime_checkable
class ComputeModel(Protocol):
    """Seconds a GPU (or tensor-parallel group) spends on prefill and on one decode step."""

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        """Seconds to prefill ``new`` tokens that follow ``cached`` tokens already in KV."""
        ...

    def decode_step_seconds(self, context: int, batch: int = 1) -> float:
        """Seconds for one decode step of ``batch`` sequences of ``context`` tokens each."""
        ...


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if value < 0:
            raise ConfigError(f"{name} must not be negative, got {value}")


@dataclass(frozen=True)
class RooflineCompute:
    """Prefill as compute-bound, decode as memory-bound, from the model's shapes and GPU specs.

    Prefill of N tokens after P cached ones costs 2 × active params × N linear FLOPs plus
    2 × layers × heads × (qk_dim + v_dim) × N × (P + (N + 1) / 2) causal-attention FLOPs, run at
    peak × ``mfu`` × ``tp`` FLOP/s. A decode step reads the weights one rank holds (for MoE, the
    experts the batch touches) and the batch's KV once, at HBM bandwidth × ``mbu``; it is never
    faster than its FLOPs at peak × ``mfu``.
    """

    model: ModelSpec
    gpu: GPU
    tp: int = 1
    mfu: float = DEFAULT_MFU
    mbu: float = DEFAULT_MBU
    compute_dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ConfigError(f"tensor parallel size must be at least 1, got {self.tp}")
        for name in ("mfu", "mbu"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"{name} must be in (0, 1], got {value}")

    @property
    def flops_per_second(self) -> float:
        """Achieved FLOP/s of the whole tensor-parallel group."""
        return self.gpu.peak_flops(self.compute_dtype) * self.mfu * self.tp

    def prefill_flops(self, new: int, cached: int = 0) -> float:
        """FLOPs to prefill ``new`` tokens after ``cached`` ones (linear + causal attention)."""
        _check_counts(new=new, cached=cached)
        m = self.model
        qk, v = m.attention_dims()
        linear = 2.0 * m.params_per_token * new
        attention = 2.0 * m.layers * m.attention_heads * (qk + v) * new * (cached + (new + 1) / 2)
        return linear + attention

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        """Seconds to prefill ``new`` tokens after ``cached`` ones (0 when there is nothing new)."""
        return self.prefill_flops(new, cached) / self.flops_per_second

    def decode_step_bytes(self, context: int, batch: int = 1) -> float:
        """HBM bytes one rank reads in one decode step: its weights plus the batch's KV."""
        _check_counts(context=context, batch=batch)
        m = self.model
        params = m.total_params
        if m.is_moe:
            params = min(m.total_params, m.params_per_token * max(batch, 1))
        weights = params * dtype_bytes(m.weight_dtype) / self.tp
        return weights + batch * context * m.kv_bytes_per_token(self.tp)

    def decode_step_seconds(self, context: int, batch: int = 1) -> float:
        """Seconds for one decode step: memory-bound read, or its FLOPs if those take longer."""
        if batch == 0:
            return 0.0
        memory = self.decode_step_bytes(context, batch) / (self.gpu.hbm_bandwidth * self.mbu)
        compute = batch * self.prefill_flops(1, context) / self.flops_per_second
        return max(memory, compute)
