"""Process groups: the CPU time a group used is read from /proc, and ending the leader ends the
group."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from kvtier.harness.processes import (
    GroupLeader,
    cpu_used,
    end_process_group,
    group_cpu_by_name,
    group_cpu_seconds,
    group_pids,
)

# a leader that starts a child which spins: both in the leader's new process group
SPIN = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    "time.sleep(60)\n"
)


@contextlib.contextmanager
def spinning_group(script: str) -> Iterator[subprocess.Popen]:
    """A python leader running ``script`` in a new process group, ended with its group."""
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        yield proc
    finally:
        end_process_group(proc)


def wait_for_cpu(read: Callable[[], float], seconds: float, timeout_s: float = 30) -> None:
    """Poll ``read`` until it reaches ``seconds`` of CPU or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while read() < seconds and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_groups_cpu_seconds_count_its_children_and_stop_with_it():
    with spinning_group(SPIN) as proc:
        first = group_cpu_seconds(proc.pid)
        # the child spins: its CPU time is the group's
        wait_for_cpu(lambda: group_cpu_seconds(proc.pid), first + 0.3)
        assert group_cpu_seconds(proc.pid) >= first + 0.3
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
    with spinning_group(SPIN_BASH) as proc:
        wait_for_cpu(lambda: group_cpu_by_name(proc.pid).get("bash", 0.0), 0.3)
        by_name = group_cpu_by_name(proc.pid)
        assert by_name["bash"] >= 0.3  # the spinning child, under its own name
        python = sum(v for k, v in by_name.items() if k != "bash")
        assert python < by_name["bash"]  # the sleeping leader used little
        assert sum(by_name.values()) == pytest.approx(group_cpu_seconds(proc.pid), abs=0.2)
    assert group_cpu_by_name(proc.pid) == {}
    assert group_cpu_by_name(proc.pid, proc_root="/nonexistent") == {}


def test_cpu_used_is_the_difference_of_two_readings_by_name():
    before = {"VLLM::EngineCor": 1.0, "VLLM::Worker": 10.0}
    after = {"VLLM::EngineCor": 4.256, "VLLM::Worker": 12.5, "python": 0.3}
    assert cpu_used(before, after) == {"VLLM::EngineCor": 3.26, "VLLM::Worker": 2.5, "python": 0.3}


# a leader that, on SIGTERM, passes it on to its child and exits at once; the child takes a
# moment to clean up (like vLLM's engine processes) and leaves a mark when it has
CLEANUP = (
    "import os, signal, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', (\n"
    "    'import signal, sys, time\\n'\n"
    "    'def done(*_):\\n'\n"
    "    '    time.sleep(0.5)\\n'\n"
    "    '    open(sys.argv[1], \"w\").close()\\n'\n"
    "    '    sys.exit(0)\\n'\n"
    "    'signal.signal(signal.SIGTERM, done)\\n'\n"
    "    'print(\"ready\", flush=True)\\n'\n"
    "    'time.sleep(60)\\n'\n"
    "), sys.argv[1]], stdout=subprocess.PIPE)\n"
    "child.stdout.readline()\n"
    "def bye(*_):\n"
    "    child.send_signal(signal.SIGTERM)\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ending_a_group_leaves_its_other_processes_the_grace_to_clean_up(tmp_path):
    mark = tmp_path / "cleaned"
    proc = subprocess.Popen(
        [sys.executable, "-c", CLEANUP, str(mark)], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        assert len(group_pids(proc.pid)) == 2
        started = time.monotonic()
        assert end_process_group(proc, grace_s=10, term=True) == 0
        assert time.monotonic() - started < 8  # not the whole grace: the group was gone
    finally:
        end_process_group(proc)
    assert mark.exists()  # the child was not killed while it cleaned up
    assert group_pids(proc.pid) == []
    assert group_pids(proc.pid, proc_root="/nonexistent") == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_group_that_will_not_end_is_killed_when_the_grace_runs_out():
    with spinning_group(SPIN) as proc:
        wait_for_cpu(lambda: group_cpu_seconds(proc.pid), 0.3)  # the child spins
        assert len(group_pids(proc.pid)) == 2
        started = time.monotonic()
        end_process_group(proc, grace_s=1.0, term=True)  # SIGTERM ends the leader, not the child
        assert 0.9 <= time.monotonic() - started < 8
        assert group_pids(proc.pid) == []


class Sleeper(GroupLeader):
    """The leader of SPIN's group: it sleeps, its child spins."""

    def __init__(self) -> None:
        self.stops = 0

    def start(self) -> Sleeper:
        self._proc = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
        return self

    def stop(self) -> int | None:
        self.stops += 1
        proc = self._release()
        return None if proc is None else end_process_group(proc)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_group_leader_stops_its_group_on_leaving_the_block_even_on_an_error():
    sleeper = Sleeper()
    assert sleeper.pid is None
    with pytest.raises(RuntimeError, match="inside"), sleeper as running:
        assert running is sleeper and sleeper.pid is not None
        pid = sleeper.pid
        wait_for_cpu(lambda: group_cpu_seconds(pid), 0.1)  # the child has started
        assert len(group_pids(pid)) == 2
        raise RuntimeError("inside")
    assert sleeper.stops == 1 and sleeper.pid is None
    assert group_pids(pid) == []
    assert sleeper.stop() is None  # nothing left to stop
