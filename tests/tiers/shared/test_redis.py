"""The Redis/Valkey tier on real servers: the conformance suite on one server, on split values
and on a 3-node cluster; URLs, TTL, refused puts, namespaced key names."""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np
import pytest
import redis
import xxhash

from kvtier.codec import BlockError, BlockHeader, BlockMeta, BufferTooSmallError, CorruptBlockError
from kvtier.codec.container import RAW_META
from kvtier.errors import ConfigError, TierUnavailableError
from kvtier.testing.tier_conformance import (
    NS_A,
    NS_B,
    TierConformance,
    check_payload,
    corrupt_value,
    make_key,
    make_payload,
)
from kvtier.tiers import open_tier
from kvtier.tiers.redis import direct_read
from kvtier.tiers.redis.direct_read import byte_windows
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.registry import check_tier_url

pytestmark = pytest.mark.services


def _prefix(root) -> str:
    """A key prefix of a test's own (the server outlives the test)."""
    return "t" + xxhash.xxh3_64_hexdigest(str(root).encode())[:12]


def _url(base: str, **options) -> str:
    sep = "&" if "?" in base else "?"
    return base + sep + "&".join(f"{k}={v}" for k, v in options.items())


class RedisConformance(TierConformance):
    server_fixture = "redis_server"
    extra: ClassVar[dict[str, str]] = {}

    @pytest.fixture(autouse=True)
    def _server(self, request):
        self.server = request.getfixturevalue(self.server_fixture)

    def make_tier(self, root, namespace, capacity, eviction="lru"):
        url = _url(self.server.url, prefix=_prefix(root), timeout=5, **self.extra)
        return open_tier(url, namespace)

    def corrupt(self, tier, key, how, *, other_key=None, other_tier=None):
        client = tier.client
        foreign = other_tier.name_of(key) if other_tier is not None else None
        other = tier.name_of(other_key) if other_key is not None else None
        corrupt_value(how, client.get, client.set, tier.name_of(key), foreign, other)
        return True


class TestRedisTier(RedisConformance):
    pass


class TestRedisTierSplitValues(RedisConformance):
    """Blocks larger than ``max_value`` over several keys (the suite's blocks are 16 KiB)."""

    extra: ClassVar[dict[str, str]] = {"max_value": "4KiB"}

    def corrupt(self, tier, key, how, *, other_key=None, other_tier=None):
        if how in ("foreign", "swap"):
            return super().corrupt(tier, key, how, other_key=other_key, other_tier=other_tier)
        if how == "truncate":
            tier.client.delete(tier.name_of(key, 2))  # a part the server dropped
            return True
        return super().corrupt(tier, key, how)


class TestRedisCluster(RedisConformance):
    """The same contract on a 3-node Redis Cluster, through the cluster client."""

    server_fixture = "redis_cluster"


def test_key_names_carry_the_namespace(redis_server, tmp_path):
    tier = open_tier(_url(redis_server.url, prefix="names"), NS_A)
    key = make_key(1)
    assert tier.put(key, make_payload(key, 0, 64))
    raw = redis.Redis.from_url(redis_server.url)
    assert raw.exists(f"names:{{{NS_A.hex()}:{key.hex()}}}")
    assert list(tier.iter_keys()) == [key]
    assert list(open_tier(_url(redis_server.url, prefix="names"), NS_B).iter_keys()) == []
    tier.close()


def test_split_block_missing_part_is_a_miss_of_its_own(redis_server, tmp_path):
    tier = open_tier(_url(redis_server.url, prefix=_prefix(tmp_path), max_value="4KiB"), NS_A)
    key = make_key(1)
    assert tier.put(key, make_payload(key, 1, 20_000))
    assert tier.client.exists(tier.name_of(key, 4))  # 20 000 + header bytes: 5 parts
    out = np.zeros(20_000, np.uint8)
    assert isinstance(tier.get_into(key, out), BlockHeader)
    tier.client.delete(tier.name_of(key, 3))
    with pytest.raises(CorruptBlockError):
        tier.get_into(key, out)
    assert tier.delete(key) and not tier.client.exists(tier.name_of(key, 4))


def test_ttl_expires_blocks(redis_server, tmp_path):
    tier = open_tier(_url(redis_server.url, prefix=_prefix(tmp_path), ttl="0.3"), NS_A)
    key = make_key(1)
    assert tier.put(key, make_payload(key, 1, 1000))
    assert 0 < tier.client.pttl(tier.name_of(key)) <= 300
    deadline = time.monotonic() + 5
    while tier.contains(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tier.contains(key)
    assert tier.get_into(key, np.zeros(1000, np.uint8)) is None  # a dropped key is a miss


def test_full_server_refuses_puts_and_stays_readable(spawn_server):
    server = spawn_server("redis", maxmemory="3mb", policy="noeviction")
    tier = open_tier(server.url, NS_A)
    keys = [make_key(i) for i in range(40)]
    done = tier.put_many([(k, make_payload(k, 0, 256 * 1024), _meta()) for k in keys])
    assert done[0] and not all(done), "a 3 MB server should take some 256 KiB blocks, not all"
    assert tier.refused_puts == done.count(False)
    assert any("refused" in n for n in tier.usage().notes)
    for key, ok in zip(keys, done, strict=True):
        out = np.zeros(256 * 1024, np.uint8)
        header = tier.get_into(key, out)
        assert (header is not None) == ok
        if ok:
            check_payload(out, 256 * 1024, key)


def _meta():
    from kvtier.codec import BlockMeta

    return BlockMeta()


def test_urls_and_options(redis_server):
    port = redis_server.port
    tier = open_tier(f"valkey://127.0.0.1:{port}/2?timeout=0.05&batch=8&name=shared", NS_A)
    assert isinstance(tier, RedisTier) and tier.name == "shared"
    assert tier.options.timeout == 0.05 and tier.options.batch == 8
    assert tier.address.endswith("/2")
    assert tier.capabilities.shared and not tier.capabilities.evicts
    tier.close()
    check_tier_url(f"redis://127.0.0.1:{port}/0?ttl=60")
    with pytest.raises(ConfigError, match="unknown redis:// tier option"):
        check_tier_url("redis://127.0.0.1:1/0?size=1GiB")
    with pytest.raises(ConfigError, match="database number"):
        open_tier(f"redis://127.0.0.1:{port}/x", NS_A)
    with pytest.raises(ConfigError, match="timeout"):
        check_tier_url("redis://127.0.0.1:1/0?timeout=0")


def test_closed_port_is_a_clear_error_at_open(tmp_path):
    from kvtier.testing.services import free_port

    port = free_port()
    began = time.monotonic()
    with pytest.raises(TierUnavailableError, match=f"127.0.0.1:{port}/0.*does not answer"):
        open_tier(f"redis://127.0.0.1:{port}/0", NS_A)
    assert time.monotonic() - began < 2
    tier = open_tier(f"redis://127.0.0.1:{port}/0?optional=1", NS_A)  # logged, degraded
    assert tier.degraded and "does not answer" in tier.degraded
    with pytest.raises(redis.ConnectionError):
        tier.contains(make_key(1))


def test_wrong_password_is_a_clear_error_never_logged(spawn_server, caplog):
    server = spawn_server("redis", password="s3cret-pass")
    good = open_tier(server.url, NS_A)
    assert good.put(make_key(1), make_payload(make_key(1), 0, 64))
    bad = server.url.replace("s3cret-pass", "wrong-pass")
    with pytest.raises(TierUnavailableError, match="refused the credentials") as info:
        open_tier(bad, NS_A)
    assert "wrong-pass" not in str(info.value) and "s3cret" not in str(info.value)
    open_tier(bad + "?optional=1", NS_A)
    assert "wrong-pass" not in caplog.text and "refused the credentials" in caplog.text


def test_rediss_speaks_tls_and_checks_the_certificate(spawn_server):
    server = spawn_server("redis", tls=True)
    assert server.url.startswith("rediss://127.0.0.1:") and "?ca=" in server.url
    tier = open_tier(f"{server.url}&timeout=2", NS_A)
    key = make_key(1)
    assert tier.put(key, make_payload(key, 5, 5000))
    out = np.zeros(5000, np.uint8)
    assert tier.get_into(key, out) is not None and check_payload(out, 5000, key) == 5
    tier.close()
    plain = server.url.split("?")[0]
    with pytest.raises(TierUnavailableError, match="does not answer"):
        open_tier(f"{plain}?timeout=2", NS_A)  # its certificate is signed by no CA we trust
    with pytest.raises(TierUnavailableError, match="does not answer"):
        open_tier(plain.replace("rediss://", "redis://") + "?timeout=0.5", NS_A)  # no TLS
    unchecked = open_tier(f"{plain}?timeout=2&verify=0", NS_A)
    assert unchecked.contains(key)
    unchecked.close()


@pytest.mark.parametrize("window", [None, 1], ids=["one-window", "a-window-per-block"])
def test_a_batch_lands_in_its_buffers_whatever_each_reply_is(
    redis_server, tmp_path, monkeypatch, window
):
    """One pipelined batch: a stored block, a miss, a corrupted value, a block of another key
    and a bf16 block stored coded, each read straight into its buffer or reported; the same
    with each GET in a window of its own."""
    if window is not None:
        monkeypatch.setattr(direct_read, "WINDOW_BYTES", window)
    tier = open_tier(_url(redis_server.url, prefix=_prefix(tmp_path), timeout=1), NS_A)
    keys = [make_key(i, b"batch") for i in range(5)]
    size = 96 * 1024
    for key in (keys[0], keys[2], keys[3]):
        assert tier.put(key, make_payload(key, 1, size))
    kv = (np.arange(size // 2, dtype=np.uint16) % 64 + 0x3F00).view(np.uint8)
    assert tier.put(keys[4], kv, BlockMeta("bf16", (size // 2,)))
    client = tier.client
    broken = bytearray(client.get(tier.name_of(keys[2])))
    broken[-1] ^= 1
    client.set(tier.name_of(keys[2]), bytes(broken))
    client.set(tier.name_of(keys[3]), client.get(tier.name_of(keys[0])))  # another key's block
    outs = [np.zeros(size, np.uint8) for _ in keys]
    got = tier.get_many_into(keys, outs)
    assert isinstance(got[0], BlockHeader) and check_payload(outs[0], size, keys[0]) == 1
    assert got[1] is None
    assert isinstance(got[2], CorruptBlockError)
    assert isinstance(got[3], BlockError)
    assert isinstance(got[4], BlockHeader) and got[4].meta.codec == "kv"
    assert np.array_equal(outs[4], kv)
    tier.close()


def test_coded_blocks_decode_as_they_arrive_from_reused_staging(redis_server, tmp_path):
    """A batch of coded blocks, a damaged one among them: each lands in a staging buffer, is
    decoded (or refused) on the codec threads, and its buffer goes back to be used again."""
    tier = open_tier(_url(redis_server.url, prefix=_prefix(tmp_path), timeout=1), NS_A)
    size = 96 * 1024
    keys = [make_key(i, b"coded") for i in range(6)]
    blocks = [
        ((np.arange(size // 2, dtype=np.uint16) * (i + 1)) % 64 + 0x3F00).view(np.uint8)
        for i in range(6)
    ]
    meta = BlockMeta("bf16", (size // 2,))
    assert tier.put_many([(k, b, meta) for k, b in zip(keys, blocks, strict=True)]) == [True] * 6
    broken = bytearray(tier.client.get(tier.name_of(keys[3])))
    broken[-1] ^= 1
    tier.client.set(tier.name_of(keys[3]), bytes(broken))
    for _ in range(3):
        outs = [np.zeros(size, np.uint8) for _ in keys]
        got = tier.get_many_into(keys, outs)
        assert isinstance(got[3], CorruptBlockError)
        for i in (0, 1, 2, 4, 5):
            assert isinstance(got[i], BlockHeader) and got[i].meta.codec == "kv"
            assert np.array_equal(outs[i], blocks[i])
    staged = tier._staging
    assert 0 < len(staged._free) <= staged.keep  # every buffer back, at most keep kept
    tier.close()


def test_a_buffer_too_small_drops_the_connection_not_the_next_read(redis_server, tmp_path):
    tier = open_tier(_url(redis_server.url, prefix=_prefix(tmp_path), timeout=1), NS_A)
    key = make_key(1, b"small")
    assert tier.put(key, make_payload(key, 1, 64 * 1024))
    with pytest.raises(BufferTooSmallError):
        tier.get_many_into([key, key], [np.zeros(1024, np.uint8), np.zeros(64 * 1024, np.uint8)])
    out = np.zeros(64 * 1024, np.uint8)
    assert isinstance(tier.get_into(key, out), BlockHeader)
    assert check_payload(out, 64 * 1024, key) == 1
    tier.close()


def test_byte_windows_cut_a_batch_into_runs_of_at_most_a_window():
    assert byte_windows([], 10) == []
    assert byte_windows([4, 4, 4, 4, 4], 10) == [(0, 2), (2, 4), (4, 5)]
    assert byte_windows([30, 2, 30], 10) == [(0, 1), (1, 2), (2, 3)]  # one item each, however big
    assert byte_windows([5, 5], 10) == [(0, 2)]


def test_a_large_batch_reads_within_the_default_timeout(redis_server, tmp_path):
    """64 blocks of 8 MiB in one batch, at the tier's default 0.1 s bound: a server copies every
    reply it was asked for before writing the first byte, so one pipeline of 512 MiB kept the
    socket silent past the bound on a healthy server; windows of replies keep bytes flowing."""
    tier = open_tier(_url(redis_server.url, prefix=_prefix(tmp_path)), NS_A)
    assert tier.options.timeout <= 0.1
    size, n = 8 << 20, 64
    keys = [make_key(i, b"large") for i in range(n)]
    payload = make_payload(keys[0], 1, size)
    for i in range(0, n, 8):
        assert all(tier.put_many([(k, payload, RAW_META) for k in keys[i : i + 8]]))
    outs = [np.zeros(size, np.uint8) for _ in keys]
    try:
        for _ in range(2):
            got = tier.get_many_into(keys, outs)
            assert all(isinstance(h, BlockHeader) for h in got)
            assert all(np.array_equal(o, payload) for o in outs)
    finally:
        tier.delete_many(keys)
        tier.close()
