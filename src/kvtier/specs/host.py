"""This host's CPU as ``/proc/cpuinfo`` gives it: its model name and the flags that change
prefill and copy speed. Every reported figure names it, and the vLLM engine's dtype follows it."""

from __future__ import annotations

import platform
import socket
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
#: The vector extensions a CPU's description names: prefill and copy speed depend on them.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class HostCPU:
    """The first processor's ``model name`` ("" where absent) and ``flags`` (empty where
    absent) in ``/proc/cpuinfo``."""

    model: str
    flags: frozenset[str]


def read_cpu(cpuinfo: Path = CPUINFO) -> HostCPU | None:
    """The CPU ``cpuinfo`` describes; None where it cannot be read (not Linux, no access)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and not model:
            model = value.strip()
        elif name == "flags" and not flags:
            flags = frozenset(value.split())
    return HostCPU(model, flags)


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name, else the platform's processor or machine string."""
    return _model(read_cpu(cpuinfo))


def cpu_description(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model and the speed-relevant extensions it has, e.g. ``AMD EPYC (avx2, avx512f,
    avx512_bf16)``; the extensions are left out where the flags cannot be read."""
    cpu = read_cpu(cpuinfo)
    if cpu is None or not cpu.flags:
        return _model(cpu)
    have = [f for f in SPEED_FLAGS if f in cpu.flags]
    return f"{_model(cpu)} ({', '.join(have) or 'no AVX2'})"


def _model(cpu: HostCPU | None) -> str:
    return (cpu.model if cpu else "") or platform.processor() or platform.machine() or "unknown"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (loopback) nobody listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


__all__ = [
    "CPUINFO",
    "SPEED_FLAGS",
    "HostCPU",
    "cpu_description",
    "cpu_model",
    "free_port",
    "read_cpu",
]
