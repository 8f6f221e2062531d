"""Running test code as an unprivileged user, for refusals that root never meets.

Tests here run as root, which may write anywhere; :func:`as_nobody` forks, drops the child to
``nobody``/``nogroup`` and runs a function there. The child reports back through pipes as JSON
(no pickle): its exit status, what it wrote to stderr, and the exception it raised, if any, by
type name, message and the attributes asked for. The child cannot import modules under a folder
``nobody`` cannot read (a venv under ``/root``): import what the function needs first.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ChildOutcome:
    """What the child did: its exit status, its stderr, and the exception it raised."""

    exit_code: int
    stderr: str
    error: str | None = None  # the exception's type name, None when it returned
    message: str = ""
    attrs: dict = field(default_factory=dict)


def as_nobody(fn: Callable[[], object], attrs: Sequence[str] = ()) -> ChildOutcome:
    """Run ``fn()`` in a forked child as nobody:nogroup (the caller must be root).

    ``SystemExit`` sets the exit status; another exception is reported with its ``attrs``.
    """
    user = pwd.getpwnam("nobody")
    try:
        gid = grp.getgrnam("nogroup").gr_gid
    except KeyError:
        gid = user.pw_gid
    err_r, err_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller
        code = 70
        try:
            os.close(err_r)
            os.close(out_r)
            os.dup2(err_w, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.setgroups([])
            os.setgid(gid)
            os.setuid(user.pw_uid)
            report: dict = {}
            try:
                fn()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:
                code = 0
                report = {
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "attrs": {a: getattr(exc, a, None) for a in attrs},
                }
            data = json.dumps(report, default=str).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(out_w, view) :]
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(code)
    os.close(err_w)
    os.close(out_w)
    stderr = _drain(err_r)
    report_bytes = _drain(out_r)
    _, status = os.waitpid(pid, 0)
    report = json.loads(report_bytes) if report_bytes else {}
    return ChildOutcome(
        os.waitstatus_to_exitcode(status),
        stderr.decode(errors="replace"),
        report.get("error"),
        report.get("message", ""),
        report.get("attrs", {}),
    )


@contextlib.contextmanager
def root_owned_dir() -> Iterator[Path]:
    """A new directory owned by root, mode 0o755, in a folder of the same mode: nobody can
    reach it but not write in it. Removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="kvtier-perm-"))
    try:
        base.chmod(0o755)
        locked = base / "locked"
        locked.mkdir(mode=0o755)
        locked.chmod(0o755)
        yield locked
    finally:
        shutil.rmtree(base)


def _drain(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


__all__ = ["ChildOutcome", "as_nobody", "root_owned_dir"]
