"""Facts about the machine a benchmark ran on: O_DIRECT support, filesystem, page-cache control."""

from __future__ import annotations

import mmap
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from kvtier.specs.host import cpu_description

ALIGN = 4096


def filesystem_of(path: Path) -> str | None:
    """Filesystem type (ext4, xfs, tmpfs …) of the mount holding ``path``, from /proc/mounts."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best, kind = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, parts[2]
    return kind


def supports_o_direct(directory: Path) -> bool:
    """Whether files in ``directory`` can be written with O_DIRECT (tmpfs, for one, cannot)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".kvtier-odirect-probe-{os.getpid()}"
    buf = mmap.mmap(-1, ALIGN)  # page-aligned
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o600)
    except OSError:
        return False
    try:
        return os.write(fd, buf) == ALIGN
    except OSError:
        return False
    finally:
        os.close(fd)
        buf.close()
        probe.unlink(missing_ok=True)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, to the hundredth (empty where unknown): a report
    keeps them so that a run on a busy host can be told apart."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def can_drop_caches() -> bool:
    """Whether this process may write /proc/sys/vm/drop_caches (root, not a read-only /proc)."""
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> bool:
    """Flush dirty pages and drop the page cache; False when not permitted."""
    if not can_drop_caches():
        return False
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class BenchEnvironment:
    """The machine and the directory a storage benchmark used."""

    cpus: int
    cpu: str  # model name and the vector extensions that change prefill and copy speed
    platform: str
    python: str
    fio: str | None
    directory: str | None
    filesystem: str | None
    o_direct: bool | None
    can_drop_caches: bool

    @classmethod
    def probe(cls, directory: Path | None, fio: str | None) -> BenchEnvironment:
        """Probe this machine (and ``directory`` when a disk tier is benchmarked)."""
        return cls(
            cpus=os.cpu_count() or 1,
            cpu=cpu_description(),
            platform=platform.platform(),
            python=platform.python_version(),
            fio=fio,
            directory=str(directory) if directory else None,
            filesystem=filesystem_of(directory) if directory else None,
            o_direct=supports_o_direct(directory) if directory else None,
            can_drop_caches=can_drop_caches(),
        )

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return asdict(self)
