"""Ending a process that leads its own process group, and everything it started; the CPU time
such a group has used; the owner of such a process, which stops it on leaving a ``with`` block.

vLLM's server and offline engines start child processes (the engine core, the worker); a
process started with ``start_new_session=True`` leads a group that holds them all, so one
``killpg`` ends what a plain kill of the leader would leave behind, and the group's processes
are found by their process group id in ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self


def end_process_group(
    proc: subprocess.Popen, grace_s: float = 0.0, term: bool = False
) -> int | None:
    """Give ``proc`` ``grace_s`` seconds to exit (after SIGTERM when ``term``), then SIGKILL its
    process group; its exit code (None if it would not die).

    A leader that exits in time leaves the rest of the grace to the group's other processes:
    vLLM's engine processes may still be shutting down when the server has exited, and killed
    then they can leave their shared-memory segments in ``/dev/shm`` for good."""
    if grace_s > 0 and proc.poll() is None:
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(ProcessLookupError):
            if term:
                proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        while group_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None
    gone = time.monotonic() + 2.0  # SIGKILL lands a moment later in the leader's orphans
    while group_pids(proc.pid) and time.monotonic() < gone:
        time.sleep(0.01)
    return code


def _group_stats(pgid: int, proc_root: str) -> Iterator[tuple[int, bytes, list[bytes]]]:
    """(pid, name, the fields after the name) of the live processes of group ``pgid``, read
    from ``/proc/<pid>/stat`` (zombies left out; nothing where ``/proc`` cannot be read)."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc_root}/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        close = stat.rindex(b")")
        fields = stat[close + 2 :].split()
        # after the name: state, ppid, pgrp, ...
        if len(fields) > 12 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            yield int(entry), stat[stat.index(b"(") + 1 : close], fields


def group_pids(pgid: int, proc_root: str = "/proc") -> list[int]:
    """The live processes of process group ``pgid``."""
    return [pid for pid, _, _ in _group_stats(pgid, proc_root)]


def group_cpu_by_name(pgid: int, proc_root: str = "/proc") -> dict[str, float]:
    """CPU seconds (user + system) the live processes of process group ``pgid`` have used, by
    process name (``VLLM::EngineCor``, ``VLLM::Worker``, …; processes of one name added up),
    read from ``/proc/<pid>/stat`` (zombies left out; empty where ``/proc`` cannot be read)."""
    ticks: dict[str, int] = {}
    for _, raw_name, fields in _group_stats(pgid, proc_root):
        name = raw_name.decode(errors="replace")
        # after the name: state, ppid, pgrp, ..., utime (12th), stime (13th)
        ticks[name] = ticks.get(name, 0) + int(fields[11]) + int(fields[12])
    per_s = os.sysconf("SC_CLK_TCK")
    return {name: t / per_s for name, t in ticks.items()}


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process name used between two readings of :func:`group_cpu_by_name`
    (a name absent before started meanwhile), to the hundredth."""
    return {name: round(s - before.get(name, 0.0), 2) for name, s in after.items()}


def group_cpu_seconds(pgid: int, proc_root: str = "/proc") -> float:
    """CPU seconds (user + system) the live processes of process group ``pgid`` have used
    (0.0 where ``/proc`` cannot be read)."""
    return sum(group_cpu_by_name(pgid, proc_root).values())


class GroupLeader(ABC):
    """Owner of a subprocess that leads its own process group: ``start`` starts it (with
    ``start_new_session=True``) and returns the owner, ``stop`` ends it and its group; as a
    context manager, leaving the ``with`` block (normally or on an exception) stops it."""

    _proc: subprocess.Popen[Any] | None = None

    @property
    def pid(self) -> int | None:
        """The leader's process id (None when not running)."""
        return self._proc.pid if self._proc is not None else None

    def _release(self) -> subprocess.Popen[Any] | None:
        """The running process, no longer held (None when there is none), for ``stop`` to end."""
        proc, self._proc = self._proc, None
        return proc

    @abstractmethod
    def start(self) -> Self:
        """Start the process; the owner itself."""

    @abstractmethod
    def stop(self) -> object:
        """End the process and its group (nothing when it is not running)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = [
    "GroupLeader",
    "cpu_used",
    "end_process_group",
    "group_cpu_by_name",
    "group_cpu_seconds",
    "group_pids",
]
