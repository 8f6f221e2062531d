"""Process groups: the CPU time a group used is read from /proc, and ending the leader ends the
group."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kvtier.engines.vllm.processes import (
    end_process_group,
    group_cpu_by_name,
    group_cpu_seconds,
)

# a leader that starts a child which spins: both in the leader's new process group
SPIN = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    "time.sleep(60)\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_groups_cpu_seconds_count_its_children_and_stop_with_it():
    proc = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        first = group_cpu_seconds(proc.pid)
        while group_cpu_seconds(proc.pid) < first + 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)  # the child spins: its CPU time is the group's
        assert group_cpu_seconds(proc.pid) >= first + 0.3
    finally:
        end_process_group(proc)
    assert proc.poll() is not None
    assert group_cpu_seconds(proc.pid) == 0.0  # nothing of the group is left
    assert group_cpu_seconds(proc.pid, proc_root="/nonexistent") == 0.0


# a python leader whose child spins under another name (bash)
SPIN_BASH = (
    "import subprocess, time\n"
    "child = subprocess.Popen(['bash', '-c', 'while :; do :; done'])\n"
    "time.sleep(60)\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_groups_cpu_seconds_are_told_apart_by_process_name():
    proc = subprocess.Popen([sys.executable, "-c", SPIN_BASH], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while group_cpu_by_name(proc.pid).get("bash", 0.0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        by_name = group_cpu_by_name(proc.pid)
        assert by_name["bash"] >= 0.3  # the spinning child, under its own name
        python = sum(v for k, v in by_name.items() if k != "bash")
        assert python < by_name["bash"]  # the sleeping leader used little
        assert sum(by_name.values()) == pytest.approx(group_cpu_seconds(proc.pid), abs=0.2)
    finally:
        end_process_group(proc)
    assert group_cpu_by_name(proc.pid) == {}
    assert group_cpu_by_name(proc.pid, proc_root="/nonexistent") == {}
