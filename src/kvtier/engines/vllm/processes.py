"""Ending a process that leads its own process group, and everything it started.

vLLM's server and offline engines start child processes (the engine core, the worker); a
process started with ``start_new_session=True`` leads a group that holds them all, so one
``killpg`` ends what a plain kill of the leader would leave behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def end_process_group(
    proc: subprocess.Popen, grace_s: float = 0.0, term: bool = False
) -> int | None:
    """Give ``proc`` ``grace_s`` seconds to exit (after SIGTERM when ``term``), then SIGKILL its
    process group; its exit code (None if it would not die)."""
    if grace_s > 0 and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if term:
                proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


__all__ = ["end_process_group"]
