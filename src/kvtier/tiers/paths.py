"""Proving that a directory (or an output file's folder) can hold files, before anything uses it.

:func:`usable_directory` creates a directory when needed and proves it usable by creating and
removing a small probe file; :func:`writable_file` does the same for the folder of a file about
to be written. Every refusal is a :class:`~kvtier.errors.TierPathError` whose one-line message
names the path, says what is wrong and what to do.

A full filesystem is not a path error: a probe that fails with ENOSPC (or EDQUOT) after the
directory exists passes, since a disk tier evicts to make room and the space may be freed by
then. A directory that cannot even be *created* for lack of space is refused (reason
``no-space``): nothing could ever be stored there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

import psutil

from kvtier.errors import TierPathError

#: Filesystem types that hold no user files (kernel interfaces); a directory on one is refused.
PSEUDO_FILESYSTEMS = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "proc",
        "pstore",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "sysfs",
        "tracefs",
    }
)

_NAME_MAX = 255
_PATH_MAX = 4096
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM)
#: Tries at a new directory that a concurrent check removed under this one.
_RACES = 3


def usable_directory(
    path: str | os.PathLike, what: str = "tier directory", *, keep: bool = True
) -> Path:
    """Create ``path`` (parents too) if needed and prove it can hold files; its absolute path.

    ``what`` starts each error message (e.g. ``"--disk-dir"``). ``keep=False`` checks without
    leaving a trace: directories created for the check are removed again. Raises TierPathError.
    """
    raw = _text(path, what)
    target = _absolute(raw)
    subject = f"{what} {_show(raw)}"
    _check_directory(target, subject, raw, own=True, keep=keep, must_exist=False)
    return Path(target)


def writable_file(
    path: str | os.PathLike, what: str = "output file", *, parents: bool = False
) -> Path:
    """Prove a file can be written at ``path`` without writing it; its absolute path.

    Its folder must exist (``parents=True``: or be creatable; nothing is left created) and hold
    files; an existing file must be writable (it is not truncated). Raises TierPathError.
    """
    raw = _text(path, what)
    target = _absolute(raw)
    subject = f"{what} {_show(raw)}"
    if os.path.isdir(target):
        raise TierPathError(
            f"{subject} is a directory; give a file name (e.g. {_show(os.path.join(raw, 'out'))})",
            raw,
            "is-a-directory",
        )
    folder = os.path.dirname(target)
    _check_directory(folder, subject, raw, own=False, keep=False, must_exist=not parents)
    if os.path.lexists(target):
        try:
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise _refusal(exc, subject, raw, target) from None
        os.close(fd)
    return Path(target)


def mount_of(path: str | os.PathLike) -> tuple[str, str] | None:
    """(filesystem type, mount point) of the mount holding an existing ``path``; None if unknown."""
    chain = _enclosing_mounts(path)
    return chain[-1] if chain else None


def _enclosing_mounts(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(fstype, mount point) of every mount ``path`` lies in, outermost first."""
    real = os.path.realpath(path)
    try:
        mounts = psutil.disk_partitions(all=True)
    except OSError:
        return []
    found: dict[str, str] = {}
    for mount in mounts:  # a later mount on the same point hides the earlier one
        point = mount.mountpoint
        if real == point or real.startswith(point.rstrip("/") + "/"):
            found[point] = mount.fstype
    return [(found[point], point) for point in sorted(found, key=len)]


# --- the checks ---------------------------------------------------------------------------------


def _check_directory(
    target: str, subject: str, raw: str, *, own: bool, keep: bool, must_exist: bool
) -> None:
    """Every check of ``target`` as a directory; ``own``: the user named it (not a file's folder).

    ``subject`` starts the messages (what and the user's path), ``raw`` is that path.
    """
    _check_lengths(target, subject, raw)
    ancestor = _nearest_existing(target)
    try:
        st = os.stat(ancestor)
    except OSError as exc:  # e.g. a folder on the way that this user may not search
        raise _refusal(exc, subject, raw, os.path.dirname(ancestor)) from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else "not a directory"
        if own and ancestor == target:
            raise TierPathError(
                f"{subject} is {kind}, not a directory; remove it or choose another directory",
                raw,
                "not-a-directory",
            )
        shown = _show(ancestor)
        raise TierPathError(
            f"{subject} lies under {shown}, which is {kind}; choose a path under a directory",
            raw,
            "not-a-directory",
        )
    pseudo = _pseudo_mount(ancestor)
    if pseudo is not None:
        raise TierPathError(
            f"{subject} lies in {pseudo[0]} (mounted at {pseudo[1]}), a pseudo filesystem that "
            "holds no files; choose a directory on a disk or tmpfs",
            raw,
            "pseudo-fs",
        )
    if must_exist and ancestor != target:
        raise TierPathError(
            f"{subject}: folder {_show(target)} does not exist; create it or choose another path",
            raw,
            "missing",
        )
    for attempt in range(_RACES):
        created = _create(target, ancestor, subject, raw)
        try:
            _probe(target, subject, raw)
            return
        except TierPathError:
            # another process checking the same new folder without keeping it (the ranks of
            # one engine, at start-up) may have removed it between our mkdir and our probe
            if os.path.isdir(target) or attempt == _RACES - 1:
                raise
        finally:
            if not keep:
                _remove(created)


def _pseudo_mount(path: str) -> tuple[str, str] | None:
    """The pseudo filesystem ``path`` is on, or lies under when that is proc or sysfs (a tmpfs
    such as /sys/fs/cgroup is scaffolding for kernel interfaces; /dev/shm stays usable)."""
    chain = _enclosing_mounts(path)
    if chain and chain[-1][0] in PSEUDO_FILESYSTEMS:
        return chain[-1]
    return next((m for m in chain if m[0] in ("proc", "sysfs")), None)


def _create(target: str, ancestor: str, subject: str, raw: str) -> list[str]:
    """Make the missing directories from ``ancestor`` down to ``target``; those made, in order."""
    missing = []
    at = target
    while at != ancestor:
        missing.append(at)
        at = os.path.dirname(at)
    created: list[str] = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                _remove(created)
                raise TierPathError(
                    f"{subject}: {_show(directory)} exists and is not a directory; remove it or "
                    "choose another path",
                    raw,
                    "not-a-directory",
                ) from None
            continue
        except OSError as exc:
            _remove(created)
            raise _refusal(exc, subject, raw, os.path.dirname(directory), creating=True) from None
        created.append(directory)
    return created


def _probe(directory: str, subject: str, raw: str) -> None:
    """Create, write and remove a small file in ``directory``; a full filesystem passes."""
    probe = os.path.join(directory, f".kvtier-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in _FULL:
            return
        raise _refusal(exc, subject, raw, directory) from None
    try:
        os.write(fd, b"kvtier probe\n")
    except OSError as exc:
        if exc.errno not in _FULL:
            raise _refusal(exc, subject, raw, directory) from None
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)


def _remove(created: list[str]) -> None:
    for directory in reversed(created):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _check_lengths(target: str, subject: str, raw: str) -> None:
    encoded = os.fsencode(target)
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > _NAME_MAX or len(encoded) >= _PATH_MAX:
        raise _too_long(subject, raw)


def _too_long(subject: str, raw: str) -> TierPathError:
    return TierPathError(
        f"{subject} is too long (names are limited to {_NAME_MAX} bytes, paths to "
        f"{_PATH_MAX - 1}); choose a shorter path",
        raw,
        "too-long",
    )


def _refusal(
    exc: OSError, subject: str, raw: str, where: str, *, creating: bool = False
) -> TierPathError:
    """The TierPathError for an OSError met at ``where`` (the folder written into)."""
    code = exc.errno
    if code == errno.ENAMETOOLONG:
        return _too_long(subject, raw)
    if code == errno.ENOTDIR:
        return TierPathError(
            f"{subject} lies under something that is not a directory; choose a path under a "
            "directory",
            raw,
            "not-a-directory",
        )
    if code == errno.EISDIR:
        return TierPathError(f"{subject} is a directory; give a file name", raw, "is-a-directory")
    if code == errno.EROFS:
        mount = mount_of(_nearest_existing(where))
        at = f" (mounted at {mount[1]})" if mount else ""
        return TierPathError(
            f"{subject} is on a read-only filesystem{at}; remount it read-write or choose "
            "another directory",
            raw,
            "read-only",
        )
    if code in _DENIED:
        return TierPathError(
            f"{subject} is not writable by uid {os.geteuid()} (permission denied in "
            f"{_show(where)}); grant write access (chown/chmod) or choose another directory",
            raw,
            "permission",
        )
    if creating and code in _FULL:
        return TierPathError(
            f"{subject} cannot be created: the filesystem is full; free space or choose "
            "another directory",
            raw,
            "no-space",
        )
    reason = exc.strerror or str(exc)
    return TierPathError(
        f"{subject} cannot be used ({reason}); choose another directory", raw, "os-error"
    )


# --- helpers ------------------------------------------------------------------------------------


def _text(path: str | os.PathLike, what: str) -> str:
    raw = os.fsdecode(os.fspath(path))
    if "\x00" in raw:
        raise TierPathError(
            f"{what} {_show(raw)} contains a NUL byte; remove it from the path", raw, "nul"
        )
    if not raw.strip():
        raise TierPathError(f"{what} is empty; give a directory path", raw, "empty")
    return raw


def _absolute(raw: str) -> str:
    return os.path.abspath(os.path.expanduser(raw))


def _nearest_existing(target: str) -> str:
    """``target`` or its closest ancestor that exists (follows links; '/' at worst).

    Stops at a path whose stat fails for another reason than its absence (e.g. EACCES).
    """
    at = target
    while True:
        try:
            os.stat(at)
            return at
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                return at
            parent = os.path.dirname(at)
            if parent == at:
                return at
            at = parent


def _show(path: str) -> str:
    """A path quoted for a one-line message (control characters escaped, long paths cut)."""
    if len(path) > 160:
        return repr(f"{path[:60]}…{path[-40:]}") + f" ({len(os.fsencode(path))} bytes)"
    return repr(path)
