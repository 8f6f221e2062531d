"""``kvtier bench storage`` on the shared tiers (real Redis and S3 servers): each row next to
the raw client (redis-py, obstore) moving values of the same size, and nothing left behind."""

from __future__ import annotations

import pytest
import redis

from kvtier.bench.storage import StorageBench, StorageBenchConfig

pytestmark = pytest.mark.services

BLOCK = 256 * 1024
BLOCKS = 8


def test_shared_tiers_are_measured_against_their_raw_clients(redis_server, s3_env):
    urls = [
        f"{redis_server.url}?prefix=bench&timeout=2",
        f"s3://kvtier-bench/b?endpoint={s3_env.endpoint}&create=1&timeout=5",
    ]
    cfg = StorageBenchConfig(
        tiers=tuple(urls),
        block_size=BLOCK,
        data_size=BLOCKS * BLOCK,
        depths=(1, 4),
        repeats=1,
        fio=False,
        lookup=False,
        min_read_seconds=0.0,
    )
    rep = StorageBench(cfg).run()
    assert [(m.scheme, m.op, m.depth) for m in rep.measurements] == [
        (scheme, op, depth)
        for scheme in ("redis", "s3")
        for depth in (1, 4)
        for op in ("write", "read")
    ]
    for m in rep.measurements:
        assert m.result.bytes == BLOCKS * BLOCK and m.result.requests == BLOCKS
        ref = m.reference
        assert ref is not None and ref.kind == "client"
        assert ref.result.bytes == BLOCKS * BLOCK and ref.result.gbps > 0
        assert ("redis-py" if m.scheme == "redis" else "obstore") in ref.detail
        assert m.ratio is not None and m.ratio > 0 and m.verdict in ("PASS", "MISS")
    # the bench's blocks and the reference's values are gone again
    left = redis.Redis.from_url(redis_server.url).scan_iter(count=1000)
    assert not [k for k in left if k.startswith((b"bench:", b"kvtier-bench-raw/"))]
