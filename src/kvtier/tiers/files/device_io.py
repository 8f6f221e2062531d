"""Moving a block's payload between a file and a tensor's memory without a host copy in
between: GPUDirect Storage through kvikio (cuFile) for CUDA tensors, plain positional reads and
writes for CPU tensors (what kvikio's compatibility mode does on a host without GDS).

A file tier with ``gds=1`` reads and writes GPU memory through :class:`KvikioFileIO`; the
tier's device verbs work the same over :class:`PosixFileIO`, which lets the whole device path
(headers, digests, verification, the ledger) run where there is no GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from kvtier.errors import ConfigError

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class DeviceFileIO(Protocol):
    """Reads and writes whole byte ranges of a file straight into or out of a tensor."""

    name: str

    def read(self, path: str, out: Any, nbytes: int, offset: int) -> int:
        """Read ``nbytes`` at ``offset`` of ``path`` into the start of ``out``; bytes read."""
        ...

    def write(self, path: str, src: Any, nbytes: int, offset: int) -> int:
        """Write the first ``nbytes`` of ``src`` at ``offset`` of ``path``; bytes written."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a benchmark records with its figures (the library and its mode)."""
        ...


def _host_view(t: Any) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable."""
    import torch

    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("PosixFileIO moves contiguous CPU tensors only")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


def _positional(call: Any, path: str, flags: int, view: memoryview, offset: int) -> int:
    """``os.preadv``/``os.pwritev`` of one buffer at ``offset`` of ``path``."""
    fd = os.open(path, flags | _O_CLOEXEC)
    try:
        return int(call(fd, [view], offset))
    finally:
        os.close(fd)


@dataclass(frozen=True)
class PosixFileIO:
    """``os.preadv``/``os.pwritev`` into and out of CPU tensors (buffered I/O)."""

    name: str = "posix"

    def read(self, path: str, out: Any, nbytes: int, offset: int) -> int:
        return _positional(os.preadv, path, os.O_RDONLY, _host_view(out)[:nbytes], offset)

    def write(self, path: str, src: Any, nbytes: int, offset: int) -> int:
        return _positional(os.pwritev, path, os.O_WRONLY, _host_view(src)[:nbytes], offset)

    def describe(self) -> dict[str, Any]:
        return {"library": "posix, buffered", "compat_mode": "n/a"}


class KvikioFileIO:
    """cuFile reads and writes between files and CUDA tensors, through kvikio. Where GDS is not
    available kvikio falls back to POSIX I/O through its own bounce buffers (compat mode), which
    :meth:`describe` records."""

    name = "kvikio"

    def __init__(self) -> None:
        self.kvikio = require_gds()

    def read(self, path: str, out: Any, nbytes: int, offset: int) -> int:
        with self.kvikio.CuFile(path, "r") as f:
            return int(f.pread(out, nbytes, offset).get())

    def write(self, path: str, src: Any, nbytes: int, offset: int) -> int:
        with self.kvikio.CuFile(path, "r+") as f:
            return int(f.pwrite(src, nbytes, offset).get())

    def describe(self) -> dict[str, Any]:
        return {"library": f"kvikio {self.kvikio.__version__}", "compat_mode": compat_mode()}


def compat_mode() -> str:
    """kvikio's compatibility mode as set (ON: POSIX through bounce buffers, OFF: cuFile,
    AUTO: cuFile where it works) and, where kvikio says, which of the two is in effect."""
    import kvikio.defaults  # type: ignore[import-not-found]

    getter = getattr(kvikio.defaults, "compat_mode", None)
    mode = getter() if getter is not None else kvikio.defaults.get("compat_mode")
    name = str(getattr(mode, "name", mode))
    preferred = getattr(kvikio.defaults, "is_compat_mode_preferred", None)
    if preferred is None:
        return name
    return f"{name} ({'POSIX' if preferred() else 'cuFile'})"


def require_gds() -> Any:
    """The kvikio module, or a ConfigError saying in one line why GDS cannot be used here."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch comes with every engine
        raise ConfigError("gds=1 needs torch with CUDA") from exc
    if not torch.cuda.is_available():
        raise ConfigError(
            f"gds=1 reads into GPU memory, but this torch ({torch.__version__}) sees no CUDA "
            "device; leave gds off"
        )
    try:
        import kvikio  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ConfigError(
            "gds=1 needs kvikio (pip install 'kvtier[gds]', or kvikio-cu12 for CUDA 12)"
        ) from exc
    return kvikio


__all__ = ["DeviceFileIO", "KvikioFileIO", "PosixFileIO", "compat_mode", "require_gds"]
