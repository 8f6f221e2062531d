"""The dtype a vLLM CPU engine computes (and keeps its KV) in, chosen for the CPU it runs on.

vLLM's CPU build computes bf16 with native instructions only where the CPU has them (AVX-512
BF16 or AMX); elsewhere it emulates bf16 through fp32 conversions, which is several times
slower than computing in fp32 outright. ``auto`` therefore picks bf16 where it is native and
fp32 where it is emulated; an explicit dtype is taken as given. The KV dtype is the engine's,
so it enters the connector's namespace and blocks of one dtype never serve an engine of another.
"""

from __future__ import annotations

from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.specs.host import CPUINFO, read_cpu

#: Names a user may give → vLLM's ``--dtype`` names.
ENGINE_DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}
#: vLLM's dtype names → kvtier's short names (specs, block metadata).
SHORT_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
#: CPU flags with which bf16 is computed natively.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this CPU computes bf16 natively (true where the flags cannot be read, so that an
    unknown CPU keeps vLLM's usual bf16)."""
    cpu = read_cpu(cpuinfo)
    return cpu is None or not cpu.flags or any(flag in cpu.flags for flag in BF16_FLAGS)


def engine_dtype(choice: str = "auto", cpuinfo: Path = CPUINFO) -> str:
    """vLLM's ``--dtype`` for ``choice`` (``auto``: bf16 where native, else fp32)."""
    name = choice.strip().lower()
    if name == "auto":
        return "bfloat16" if native_bf16(cpuinfo) else "float32"
    try:
        return ENGINE_DTYPES[name]
    except KeyError:
        raise ConfigError(
            f"unknown engine dtype {choice!r}; use auto, bf16, fp16 or fp32"
        ) from None


def short_name(dtype: str) -> str:
    """kvtier's short name (``bf16``, ``fp16``, ``fp32``) of an engine dtype."""
    return SHORT_NAMES[engine_dtype(dtype)]


__all__ = ["BF16_FLAGS", "ENGINE_DTYPES", "engine_dtype", "native_bf16", "short_name"]
