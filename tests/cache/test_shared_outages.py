"""A cache workload over host memory and a shared tier whose real server is killed (SIGKILL) or
paused (SIGSTOP: it accepts and never answers) and comes back: no call fails or waits past the
tier's bounded timeout for long, the breaker stops paying that timeout on every request, data
comes from the other tier or is recomputed, and the shared tier is used again within 5 s of
answering. Loopback servers only."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from kvtier.cache import CacheConfig, TieredCache
from kvtier.codec import BlockHeader
from kvtier.errors import TierUnavailableError
from kvtier.testing.cache_conformance import (
    CHUNK_BYTES,
    META,
    NAMESPACE,
    chunk_keys,
    kv_chunk,
    load_checked,
)
from kvtier.tiers.registry import open_tier

pytestmark = pytest.mark.services

CHUNKS = 4  # per request
RESUME_S = 5.0


def _url(server, kind: str) -> str:
    if kind == "redis":
        return f"{server.url}?timeout=0.3&name=shared"
    if kind == "mooncake":
        return f"{server.url}&timeout=0.3&name=shared"
    return f"s3://kvtier-outage?endpoint={server.endpoint}&create=1&timeout=0.5&name=shared"


def _request(cache: TieredCache, n: int) -> tuple[int, float]:
    """One request: look up, load the hit prefix (checked), store all chunks. (loaded, secs)."""
    keys = chunk_keys(CHUNKS, start=n * 1_000_000)
    began = time.perf_counter()
    loaded = load_checked(cache, keys)
    cache.store(keys[loaded:], [kv_chunk(k) for k in keys[loaded:]], META)
    return loaded, time.perf_counter() - began


def _in_shared(tier, n: int) -> bool:
    keys = chunk_keys(CHUNKS, start=n * 1_000_000)
    out = np.zeros(CHUNK_BYTES, np.uint8)
    try:
        return all(isinstance(tier.get_into(k, out), BlockHeader) for k in keys)
    except Exception:
        return False


def _take_a_write(probe) -> None:
    """Put one object through ``probe`` until the server takes it: a new S3 bucket's first write
    allocates a volume, and a just-restarted SeaweedFS refuses writes until its filer reaches
    its master again (a server that never takes one within 30 s fails the test)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            probe.put(b"w" * 16, b"warm")
            return
        except TierUnavailableError:
            assert time.monotonic() < deadline, "the server took no write within 30 s"
            time.sleep(0.2)


def _warm(cache: TieredCache, probe, requests: int) -> None:
    """Store ``requests`` requests until the shared tier holds them all (a loaded machine may
    time out a write and open the breaker for a while)."""
    deadline = time.monotonic() + 30
    while True:
        missing = [n for n in range(requests) if not _in_shared(probe, n)]
        if not missing:
            break
        assert time.monotonic() < deadline, f"requests {missing} never reached the shared tier"
        if not cache.tier_up(1):
            time.sleep(0.2)
            continue
        for n in missing:
            _request(cache, n)
        assert cache.flush(timeout=30)
    for n in range(requests - 2):  # whatever memory still holds of the old ones goes
        cache.tiers[0].delete_many(chunk_keys(CHUNKS, start=n * 1_000_000))


@pytest.mark.parametrize(
    ("kind", "sig"),
    [
        ("redis", "kill"),
        ("redis", "stop"),
        ("s3", "kill"),
        ("s3", "stop"),
        ("mooncake", "kill"),
        ("mooncake", "stop"),
    ],
)
def test_workload_survives_a_dead_or_hung_server(spawn_server, monkeypatch, kind, sig):
    server = spawn_server(kind)
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    memory = open_tier(
        f"memory://?size={2 * CHUNKS * (CHUNK_BYTES + 4096)}&name=dram", NAMESPACE.id
    )
    shared = open_tier(_url(server, kind), NAMESPACE.id)
    slow = (
        _url(server, kind).replace("timeout=0.1", "timeout=5").replace("timeout=0.3", "timeout=5")
    )
    probe = open_tier(slow, NAMESPACE.id)
    cache = TieredCache([memory, shared], CacheConfig(chunk_tokens=16))
    try:
        _take_a_write(probe)  # a new S3 bucket's first write allocates its volume
        _warm(cache, probe, 6)  # the shared tier holds them all; memory only the last two
        assert _request(cache, 0)[0] == CHUNKS  # from the shared tier

        server.signal(signal.SIGKILL if sig == "kill" else signal.SIGSTOP)
        if sig == "kill":
            server.procs[0].wait(10)
        times = []
        for n in range(1, 30):  # old prefixes: memory lost most, the shared tier is out
            _, seconds = _request(cache, n % 6)
            times.append(seconds)
        metrics = cache.metrics.as_dict()["tiers"]["shared"]
        assert metrics["tier_outages"] == 1 and metrics["tier_errors"] >= 1
        assert not cache.tier_up(1)
        assert metrics["tier_down"] == 1.0
        assert "kvtier_cache_tier_down" in cache.metrics.prometheus_text()
        # 29 requests of a lookup, a load and a store each: without the breaker every one would
        # have paid the timeout; with it, only the probes after each back-off did
        assert metrics["tier_errors"] <= 6, metrics
        assert max(times) < 5.0  # never a hang
        assert metrics["dropped_writes"] > 0  # writes for the shared tier dropped, not queued

        if sig == "kill":
            server = spawn_server.restart(server)  # on the same port(s); Redis comes back empty
            if kind == "s3":  # a restarted SeaweedFS allocates its volume again, as at the start
                _take_a_write(probe)
        else:
            server.signal(signal.SIGCONT)
        back = time.monotonic()
        n = 100
        while time.monotonic() - back < RESUME_S + 2:
            n += 1
            _request(cache, n)
            cache.flush(timeout=5)
            if _in_shared(probe, n):
                break
            time.sleep(0.1)
        resumed = time.monotonic() - back
        assert resumed < RESUME_S, f"the shared tier was used again only after {resumed:.1f} s"
        assert cache.tier_up(1)
        if sig == "stop":  # the paused server kept its data: old prefixes load from it again
            memory.delete_many(chunk_keys(CHUNKS, start=2_000_000))
            assert _request(cache, 2)[0] == CHUNKS
    finally:
        cache.close()
        for tier in (probe, shared, memory):
            tier.close()
