"""The host's CPU from /proc/cpuinfo text: its model, its flags, and the description figures
are reported with."""

from __future__ import annotations

import platform

from kvtier.specs.host import cpu_description, cpu_model, read_cpu

TWO_CORES = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
    "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n\n"
    "processor\t: 1\nmodel name\t: something else\nflags\t\t: fpu\n"
)


def test_the_first_processor_names_the_model_and_its_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(TWO_CORES)
    cpu = read_cpu(path)
    assert cpu is not None and cpu.model == "AMD EPYC 9R14"
    assert {"avx2", "avx512_bf16"} <= cpu.flags and "fpu" in cpu.flags
    assert cpu_model(path) == "AMD EPYC 9R14"
    assert cpu_description(path) == "AMD EPYC 9R14 (avx2, avx512f, avx512_bf16)"


def test_a_cpu_without_avx2_says_so_and_a_missing_model_falls_back(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu sse2\n")
    fallback = platform.processor() or platform.machine() or "unknown"
    assert cpu_model(path) == fallback
    assert cpu_description(path) == f"{fallback} (no AVX2)"


def test_an_unreadable_cpuinfo_gives_the_platforms_name(tmp_path):
    missing = tmp_path / "missing"
    assert read_cpu(missing) is None
    assert cpu_description(missing) == cpu_model(missing) != ""
