"""A compressed shared tier: Redis, S3 and Mooncake store KV-like blocks with the kv codec (their
default), smaller than raw, and give back the same bytes; ``codec=raw`` stores them as they are."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from kvtier.codec import BlockMeta
from kvtier.tiers import open_tier

pytestmark = pytest.mark.services

NS = bytes(range(16))
SHAPE = (4, 2, 3, 256, 64)  # layers, k/v, kv heads, tokens, head dim: 768 KiB of bf16


def _kv_block(seed: int) -> np.ndarray:
    """A bf16 KV-like block (per-channel scales), as bytes."""
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-6, 3, size=(*SHAPE[:-2], 1, SHAPE[-1])))
    x = (rng.standard_normal(SHAPE, dtype=np.float32) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).ravel()


@pytest.fixture(params=["redis", "s3", "mooncake"])
def shared_url(request, monkeypatch):
    prefix = "codec" + uuid.uuid4().hex[:8]
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return f"{server.url}?prefix={prefix}&timeout=1"
    if request.param == "mooncake":
        server = request.getfixturevalue("mooncake_server")
        return f"{server.url}&prefix={prefix}&timeout=1"
    server = request.getfixturevalue("s3_server")
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return f"s3://kvcodec?endpoint={server.endpoint}&create=1&prefix={prefix}&timeout=2"


def test_shared_tiers_store_kv_coded_by_default_and_give_back_the_same_bytes(shared_url):
    meta = BlockMeta("bf16", SHAPE)
    blocks = [_kv_block(i) for i in range(7)]  # a batch the codec threads encode ahead
    for codec, suffix in (("kv", ""), ("raw", "&codec=raw")):
        tier = open_tier(shared_url + suffix, NS)
        try:
            keys = [uuid.uuid4().bytes for _ in blocks]
            assert tier.put_many([(k, b, meta) for k, b in zip(keys, blocks, strict=True)]) == [
                True
            ] * len(blocks)
            outs = [np.zeros(b.size, np.uint8) for b in blocks]
            headers = tier.get_many_into(keys, outs)
            for header, out, block in zip(headers, outs, blocks, strict=True):
                assert header.meta.codec == codec
                assert (header.stored_len < 0.8 * block.size) == (codec == "kv")
                assert np.array_equal(out, block)
        finally:
            tier.close()
