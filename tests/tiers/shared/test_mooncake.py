"""The Mooncake Store tier on a real master and store process: the conformance suite, URLs,
leases, a master killed, paused and started again, a second process reading what the first
stored, and every listener of the store on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import xxhash

from kvtier.codec import BlockHeader
from kvtier.errors import ConfigError, TierUnavailableError
from kvtier.testing.tier_conformance import (
    NS_A,
    TierConformance,
    check_payload,
    corrupt_value,
    make_key,
)
from kvtier.testing.tier_conformance import make_payload as payload
from kvtier.tiers import open_tier
from kvtier.tiers.mooncake.tier import MooncakeTier
from kvtier.tiers.registry import check_tier_url

pytestmark = pytest.mark.services

BLOCK = 64 * 1024


def _prefix(root) -> str:
    """A name prefix of a test's own (the store outlives the test)."""
    return "t" + xxhash.xxh3_64_hexdigest(str(root).encode())[:12]


def _url(server, **options) -> str:
    return server.url + "".join(f"&{k}={v}" for k, v in options.items())


class TestMooncakeTier(TierConformance):
    @pytest.fixture(autouse=True)
    def _server(self, mooncake_server):
        self.server = mooncake_server

    def make_tier(self, root, namespace, capacity, eviction="lru"):
        return open_tier(_url(self.server, prefix=_prefix(root), timeout=5), namespace)

    def corrupt(self, tier, key, how, *, other_key=None, other_tier=None):
        store = tier.client

        def put(name: str, value: bytes) -> None:
            assert store.upsert(name, value) == 0

        foreign = other_tier.name_of(key) if other_tier is not None else None
        other = tier.name_of(other_key) if other_key is not None else None
        corrupt_value(how, store.get, put, tier.name_of(key), foreign, other)
        return True


def test_url_options_and_names(mooncake_server, tmp_path):
    tier = open_tier(_url(mooncake_server, prefix="names", name="shared", timeout=1), NS_A)
    assert isinstance(tier, MooncakeTier) and tier.name == "shared"
    assert tier.capabilities.shared and not tier.capabilities.evicts
    assert tier.options.global_segment_size == 0  # the store process holds the capacity
    key = make_key(1)
    assert tier.put(key, payload(key, 0, 100))
    assert tier.name_of(key) == f"names:{NS_A.hex()}:{key.hex()}"
    assert list(tier.iter_keys()) == [key]
    assert tier.usage().capacity_bytes == 256 * 1024**2  # Mooncake reads "256MB" as MiB
    assert tier.delete(key)
    tier.close()
    check_tier_url(_url(mooncake_server, protocol="rdma", device_name="mlx5_0"))
    with pytest.raises(ConfigError, match="no TTL"):
        check_tier_url(_url(mooncake_server, ttl=60))
    with pytest.raises(ConfigError, match="unknown mooncake:// tier option"):
        check_tier_url(_url(mooncake_server, size="1GiB"))
    with pytest.raises(ConfigError, match="protocol"):
        check_tier_url(_url(mooncake_server, protocol="udp"))
    with pytest.raises(ConfigError, match="takes no path"):
        open_tier("mooncake://127.0.0.1:1/x", NS_A)
    with pytest.raises(ConfigError, match="needs the master's address"):
        open_tier("mooncake://?protocol=tcp", NS_A)


def test_closed_port_is_a_clear_error_at_open():
    from kvtier.testing.services import free_port

    url = f"mooncake://127.0.0.1:{free_port()}"
    began = time.monotonic()
    with pytest.raises(TierUnavailableError, match="does not answer"):
        open_tier(url, NS_A)
    assert time.monotonic() - began < 2
    tier = open_tier(url + "?optional=1", NS_A)  # logged, degraded
    assert tier.degraded and "does not answer" in tier.degraded
    began = time.monotonic()
    with pytest.raises(TierUnavailableError, match=r"not connected|does not answer"):
        tier.contains(make_key(1))
    assert time.monotonic() - began < 1
    tier.close()


def test_a_delete_a_lease_holds_off_is_done_here_and_later_in_the_store(mooncake_server, tmp_path):
    """A read (or a lookup) leases the object (2 s on the test master): the delete right after
    it counts as done (a miss here at once) and the store drops the object once the lease is
    over. The other client looks through the admin server's listing, which takes no lease."""
    url = _url(mooncake_server, prefix=_prefix(tmp_path), timeout=2)
    tier, other = open_tier(url, NS_A), open_tier(url, NS_A)
    key = make_key(1)
    assert tier.put(key, payload(key, 1, BLOCK))
    assert tier.get_into(key, np.zeros(BLOCK, np.uint8)) is not None  # takes the lease
    assert tier.delete(key) is True
    assert not tier.contains(key) and tier.get_into(key, np.zeros(BLOCK, np.uint8)) is None
    assert list(tier.iter_keys()) == [] and tier.usage().blocks == 0
    assert list(other.iter_keys()) == [key]  # the store still holds it
    assert tier.delete(key) is False  # already gone here
    deadline = time.monotonic() + 10
    while list(other.iter_keys()):
        assert time.monotonic() < deadline, "the object outlived its lease"
        tier.contains(make_key(2))  # any verb tries the removal again when it is due
        time.sleep(0.2)
    # a put of a key whose removal waits ends the wait: the new block stays
    assert tier.put(key, payload(key, 2, BLOCK))
    out = np.zeros(BLOCK, np.uint8)
    assert tier.get_into(key, out) is not None and check_payload(out, BLOCK, key) == 2
    assert tier.delete(key) is True
    assert tier.put(key, payload(key, 3, BLOCK))
    time.sleep(2.5)
    tier.contains(make_key(2))
    assert other.get_into(key, out) is not None and check_payload(out, BLOCK, key) == 3
    tier.close()
    other.close()


def _calls(tier, key) -> dict[str, float]:
    """Seconds each verb took against the tier (whatever it answered or raised)."""
    times = {}
    for verb, call in (
        ("contains", lambda: tier.contains(key)),
        ("get", lambda: tier.get_into(key, np.zeros(BLOCK, np.uint8))),
        ("put", lambda: tier.put(key, payload(key, 9, BLOCK))),
        ("delete", lambda: tier.delete(key)),
    ):
        began = time.monotonic()
        with contextlib.suppress(Exception):
            call()
        times[verb] = time.monotonic() - began
    return times


def _until(check, seconds: float) -> float:
    began = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - began
        except Exception:
            pass
        assert time.monotonic() - began < seconds, f"not within {seconds} s"
        time.sleep(0.1)


def test_a_paused_master_costs_the_timeout_and_a_killed_one_loses_its_objects(spawn_server):
    server = spawn_server("mooncake")
    tier = open_tier(_url(server, timeout=0.3), NS_A)
    keys = [make_key(i) for i in range(4)]
    for key in keys:
        assert tier.put(key, payload(key, 1, BLOCK))
    master = server.procs[0]

    master.send_signal(signal.SIGSTOP)  # accepts, never answers
    for _ in range(3):
        times = _calls(tier, keys[0])
        assert max(times.values()) < 1.0, times
    with pytest.raises((TimeoutError, ConnectionError)):
        tier.contains(keys[0])
    master.send_signal(signal.SIGCONT)
    resumed = _until(lambda: tier.contains(keys[1]), 5)
    out = np.zeros(BLOCK, np.uint8)
    assert tier.get_into(keys[1], out) is not None and check_payload(out, BLOCK, keys[1]) == 1

    master.send_signal(signal.SIGKILL)
    master.wait(10)
    times = _calls(tier, keys[1])
    assert max(times.values()) < 1.0, times
    server = spawn_server.restart(server)  # empty: the store process mounts on it again
    back = _until(lambda: tier.put(keys[2], payload(keys[2], 2, BLOCK)), 10)
    assert tier.get_into(keys[1], out) is None  # lost with the old master: a miss
    assert tier.get_into(keys[2], out) is not None and check_payload(out, BLOCK, keys[2]) == 2
    tier.close()
    print(f"after SIGCONT the tier answered in {resumed:.1f} s, after a restart in {back:.1f} s")


def test_another_process_reads_what_one_stored(mooncake_server, tmp_path):
    url = _url(mooncake_server, prefix=_prefix(tmp_path), timeout=5)
    tier = open_tier(url, NS_A)
    keys = [make_key(i, b"reuse") for i in range(3)]
    for key in keys:
        assert tier.put(key, payload(key, 7, BLOCK))
    script = textwrap.dedent(
        f"""
        import numpy as np
        from kvtier.testing.tier_conformance import NS_A, check_payload, make_key, make_payload
        from kvtier.tiers import open_tier
        tier = open_tier({url!r}, NS_A)
        keys = [make_key(i, b"reuse") for i in range(3)]
        outs = [np.zeros({BLOCK}, np.uint8) for _ in keys]
        got = tier.get_many_into(keys, outs)
        print(*[check_payload(o, {BLOCK}, k) if g else -1 for k, o, g in zip(keys, outs, got)])
        mine = make_key(9, b"reuse")
        assert tier.put(mine, make_payload(mine, 8, {BLOCK}))
        tier.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["7", "7", "7"]
    mine = make_key(9, b"reuse")
    out = np.zeros(BLOCK, np.uint8)
    assert isinstance(tier.get_into(mine, out), BlockHeader)
    assert check_payload(out, BLOCK, mine) == 8
    tier.close()


def _listeners(pids: set[int]) -> list[str]:
    """The local addresses the processes ``pids`` listen on (``ss -ltnp``)."""
    lines = subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=True
    ).stdout.splitlines()
    out = []
    for line in lines:
        if any(f"pid={pid}," in line for pid in pids):
            out.append(line.split()[3])
    return out


def test_every_listener_of_the_store_is_on_loopback(mooncake_server):
    tier = open_tier(mooncake_server.url, NS_A)  # a client at work
    try:
        addresses = _listeners(set(mooncake_server.pids))
        # master: RPC, HTTP metadata, HTTP admin; store process: its RPC, transfer engine's two
        assert len(addresses) == 6, addresses
        loopback = ("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")
        assert all(a.startswith(loopback) for a in addresses), addresses
        # the client's own transfer engine (in this process) binds every interface, as every
        # Mooncake client does (documented); the test runner preloads the loopback shim into
        # every process of the suite, so here it too is on loopback
        mine = _listeners({os.getpid()})
        assert mine, "the client opened no listener"
        if "loopback-bind" not in os.environ.get("LD_PRELOAD", ""):
            pytest.skip("run through scripts/test.sh (make test), which preloads the shim")
        assert all(a.startswith(loopback) for a in mine), mine
    finally:
        tier.close()
