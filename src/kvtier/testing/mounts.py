"""Real, small filesystems for tests: an image file, mkfs, a loop device, a mount point.

:func:`loop_mount` gives a test a filesystem of its own, e.g. a read-only one, one that runs out
of space or of inodes (``inodes=``, ext2/3/4 only), and always tears it down. It needs root (with
CAP_SYS_ADMIN), ``losetup``/``mount``/``umount`` (Debian: ``mount``), ``mkfs.<fstype>``
(``e2fsprogs`` for ext4) and a loop driver (``/dev/loop-control``); ``scripts/system-deps.sh``
installs the tools. :func:`loop_mount_available` says why they cannot work here, or None.

In tests call :func:`require_loop_mounts`: where loop mounts cannot work it fails the test (the
machine is set up wrongly) unless ``KVTIER_ALLOW_SKIP_MOUNTS=1``, which turns that into a skip.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

#: Set to 1 to skip (not fail) tests needing loop mounts where they cannot work.
ALLOW_SKIP_ENV = "KVTIER_ALLOW_SKIP_MOUNTS"

_CAP_SYS_ADMIN = 21
_QUIET = {
    "ext2": ("-q", "-F"),
    "ext3": ("-q", "-F"),
    "ext4": ("-q", "-F"),
    "xfs": ("-q", "-f"),
    "btrfs": ("-q", "-f"),
}
_TIMEOUT_S = 60
#: Debian packages of the mkfs tools.
_PACKAGES = {
    "ext2": "e2fsprogs",
    "ext3": "e2fsprogs",
    "ext4": "e2fsprogs",
    "xfs": "xfsprogs",
    "btrfs": "btrfs-progs",
    "vfat": "dosfstools",
}
#: Smallest sizes mkfs accepts (the images are sparse: the size costs no disk).
_TRIAL_BYTES = {"xfs": 320 << 20, "btrfs": 128 << 20}


class LoopMountError(RuntimeError):
    """Making, mounting or tearing down a loop-mounted filesystem failed."""


def loop_mount_available(fstype: str = "ext4") -> str | None:
    """Why loop mounts of ``fstype`` cannot work on this machine, or None when they do.

    Checks root, CAP_SYS_ADMIN, the tools and the loop driver, then mounts a small filesystem
    once per process (cached) to be sure.
    """
    why = _missing(fstype)
    return why if why is not None else _trial(fstype)


def require_loop_mounts(fstype: str = "ext4") -> None:
    """In a test: fail where loop mounts cannot work, skip instead if KVTIER_ALLOW_SKIP_MOUNTS=1."""
    import pytest

    why = loop_mount_available(fstype)
    if why is None:
        return
    if os.environ.get(ALLOW_SKIP_ENV) == "1":
        pytest.skip(why)
    pytest.fail(
        f"{why} (run scripts/system-deps.sh as root, or set "
        f"{ALLOW_SKIP_ENV}=1 to skip these tests)",
        pytrace=False,
    )


@contextlib.contextmanager
def loop_mount(
    size_bytes: int,
    *,
    fstype: str = "ext4",
    readonly: bool = False,
    inodes: int | None = None,
    mkfs_options: Sequence[str] = (),
) -> Iterator[Path]:
    """Mount a fresh ``fstype`` filesystem of ``size_bytes`` on a loop device; yield its root.

    ``readonly``: mounted read-only (``-o ro``). ``inodes``: how many inodes mkfs makes (ext2/3/4,
    ``mkfs -N``; the filesystem rounds up to whole groups, see ``os.statvfs(root).f_files``).
    ``mkfs_options`` go to mkfs as they are (e.g. ``("-m", "0")``: no root-reserved blocks).
    The filesystem is unmounted, its loop device detached and its image removed on exit, also
    when the body raises. Raises LoopMountError when any step fails.
    """
    if size_bytes <= 0:
        raise ValueError(f"size_bytes must be positive, got {size_bytes}")
    if inodes is not None and (not fstype.startswith("ext") or inodes < 1):
        raise ValueError("inodes= needs fstype ext2, ext3 or ext4 and a positive count")
    why = _missing(fstype)
    if why is not None:
        raise LoopMountError(f"loop mounts unavailable: {why}")
    work = Path(tempfile.mkdtemp(prefix="kvtier-loop-"))
    image, point = work / "image", work / "mnt"
    device: str | None = None
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        mkfs = [f"mkfs.{fstype}", *_QUIET.get(fstype, ())]
        if inodes is not None:
            mkfs += ["-N", str(inodes)]
        _run([*mkfs, *mkfs_options, str(image)], "mkfs")
        device = _run(["losetup", "--find", "--show", str(image)], "losetup").strip()
        point.mkdir()
        _run(["mount", "-t", fstype, "-o", "ro" if readonly else "rw", device, str(point)], "mount")
        mounted = True
        yield point
    finally:
        problems = []
        if mounted:
            problems += _unmount(point)
        if device:
            with contextlib.suppress(LoopMountError):
                _run(["losetup", "-d", device], "losetup -d")
        if mounted and os.path.ismount(point):
            problems.append(f"{point} is still mounted; left {work} in place")
        else:
            shutil.rmtree(work, ignore_errors=True)
        if problems and sys.exc_info()[0] is None:
            raise LoopMountError("; ".join(problems))


def _unmount(point: Path) -> list[str]:
    """Unmount ``point``; lazily when it is busy (a file still open). Problems, if any."""
    try:
        _run(["umount", str(point)], "umount")
        return []
    except LoopMountError as exc:
        try:
            _run(["umount", "-l", str(point)], "umount -l")
        except LoopMountError as lazy:
            return [str(exc), str(lazy)]
        return []


def _run(cmd: list[str], what: str) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LoopMountError(f"{what} failed: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise LoopMountError(f"{what} failed (exit {done.returncode}): {tail[0]}")
    return done.stdout


def _missing(fstype: str) -> str | None:
    """What loop mounts lack here without trying one (None: nothing known missing)."""
    if not sys.platform.startswith("linux"):
        return f"loop mounts need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return f"loop mounts need root; running as uid {os.geteuid()}"
    if not _has_cap_sys_admin():
        return "root lacks CAP_SYS_ADMIN (an unprivileged container?); mount cannot work"
    for tool in ("losetup", "mount", "umount", f"mkfs.{fstype}"):
        if shutil.which(tool) is None:
            package = _PACKAGES.get(fstype, "?") if tool.startswith("mkfs.") else "mount"
            return f"{tool} is not installed (Debian package {package})"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control: the loop driver is not loaded or /dev is not shared"
    return None


def _has_cap_sys_admin() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return True  # unknown: let the trial mount tell


@functools.cache
def _trial(fstype: str) -> str | None:
    try:
        with loop_mount(_TRIAL_BYTES.get(fstype, 16 << 20), fstype=fstype) as root:
            (root / "probe").write_bytes(b"kvtier")
    except (LoopMountError, OSError) as exc:
        return str(exc)
    return None
