"""The engine dtype follows the CPU: bf16 where it is native, fp32 where vLLM would emulate it."""

from __future__ import annotations

import pytest

from kvtier.engines.vllm.dtype import engine_dtype, native_bf16, short_name
from kvtier.errors import ConfigError

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"


@pytest.mark.parametrize(
    "cpuinfo, native", [(AVX2, False), (AVX512_BF16, True), (AMX, True), ("", True)]
)
def test_auto_is_bf16_where_native_and_fp32_where_emulated(tmp_path, cpuinfo, native):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert native_bf16(path) is native
    assert engine_dtype("auto", path) == ("bfloat16" if native else "float32")


def test_a_flag_that_only_contains_the_name_does_not_count(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("flags\t\t: avx2 avx512_bf16x\n")
    assert not native_bf16(path)


def test_an_unreadable_cpuinfo_keeps_bf16(tmp_path):
    assert native_bf16(tmp_path / "missing")


def test_given_names_map_to_vllms_and_back():
    assert engine_dtype("BF16") == "bfloat16" and engine_dtype("half") == "float16"
    assert engine_dtype("float32") == "float32"
    assert [short_name(d) for d in ("bfloat16", "fp16", "float")] == ["bf16", "fp16", "fp32"]


def test_an_unknown_dtype_is_refused():
    with pytest.raises(ConfigError, match="unknown engine dtype 'int4'"):
        engine_dtype("int4")
