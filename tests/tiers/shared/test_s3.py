"""The S3 tier on a real SeaweedFS server: the conformance suite, buckets, credentials, TTL."""

from __future__ import annotations

import time

import numpy as np
import obstore
import pytest
import xxhash

from kvtier.codec.container import RAW_META
from kvtier.errors import ConfigError, TierUnavailableError
from kvtier.testing.tier_conformance import (
    NS_A,
    TierConformance,
    corrupt_value,
    make_key,
    make_payload,
)
from kvtier.tiers import open_tier
from kvtier.tiers.registry import check_tier_url
from kvtier.tiers.s3.tier import S3Tier

pytestmark = pytest.mark.services

BUCKET = "kvtier-tests"


def _url(server, bucket: str = BUCKET, path: str = "", **options) -> str:
    opts = {"endpoint": server.endpoint, "create": 1, **options}
    return f"s3://{bucket}/{path}?" + "&".join(f"{k}={v}" for k, v in opts.items())


class TestS3Tier(TierConformance):
    @pytest.fixture(autouse=True)
    def _server(self, s3_env):
        self.server = s3_env

    def make_tier(self, root, namespace, capacity, eviction="lru"):
        prefix = "t" + xxhash.xxh3_64_hexdigest(str(root).encode())[:12]
        return open_tier(_url(self.server, prefix=prefix, timeout=5), namespace)

    def corrupt(self, tier, key, how, *, other_key=None, other_tier=None):
        store = tier.store

        def get(path: str) -> bytes:
            return obstore.get(store, path).bytes().to_bytes()

        def put(path: str, value: bytes) -> None:
            obstore.put(store, path, value)

        foreign = other_tier.path_of(key) if other_tier is not None else None
        other = tier.path_of(other_key) if other_key is not None else None
        corrupt_value(how, get, put, tier.path_of(key), foreign, other)
        return True


def test_url_and_object_names(s3_env):
    tier = open_tier(_url(s3_env, path="fleet/a", name="shared", timeout=1), NS_A)
    assert isinstance(tier, S3Tier) and tier.name == "shared"
    assert tier.capabilities.shared and not tier.capabilities.evicts
    key = make_key(1)
    assert tier.put(key, make_payload(key, 0, 100))
    assert tier.path_of(key) == f"fleet/a/kvtier/{NS_A.hex()}/{key.hex()}"
    assert list(tier.iter_keys()) == [key]
    tier.close()
    check_tier_url(_url(s3_env, ttl=60))
    with pytest.raises(ConfigError, match="needs a bucket"):
        open_tier("s3:///x?endpoint=http://127.0.0.1:1", NS_A)
    with pytest.raises(ConfigError, match="too short"):
        open_tier(_url(s3_env, bucket="ab"), NS_A)


def test_missing_bucket_is_a_clear_error_unless_create(s3_env):
    url = _url(s3_env, bucket="kvtier-absent", create=0)
    with pytest.raises(TierUnavailableError, match=r"no bucket 'kvtier-absent'.*create=1"):
        open_tier(url, NS_A)
    # create=1; a new bucket's first write may take the server a while (a volume to grow)
    tier = open_tier(_url(s3_env, bucket="kvtier-made", timeout=5), NS_A)
    assert tier.put(make_key(1), make_payload(make_key(1), 0, 64))
    open_tier(_url(s3_env, bucket="kvtier-made", create=0), NS_A).close()
    tier.close()


def test_wrong_credentials_are_a_clear_error_never_logged(s3_env, monkeypatch, caplog):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    with pytest.raises(TierUnavailableError, match="refused the credentials") as info:
        open_tier(_url(s3_env), NS_A)
    assert "wrong-secret-value" not in str(info.value)
    tier = open_tier(_url(s3_env, optional=1), NS_A)
    assert tier.degraded and "wrong-secret-value" not in caplog.text
    tier.close()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")  # anonymous: refused too, no credential lookups
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(TierUnavailableError, match="refused the credentials"):
        open_tier(_url(s3_env), NS_A)


@pytest.mark.parametrize("credentials", [True, False])
def test_closed_port_is_a_clear_error_at_open(credentials, s3_server, monkeypatch):
    from kvtier.testing.services import free_port

    for name, value in s3_server.env.items():
        if credentials:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)

    url = f"s3://{BUCKET}?endpoint=http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    with pytest.raises(TierUnavailableError, match="does not answer"):
        open_tier(url, NS_A)
    assert time.monotonic() - began < 5


def test_ttl_makes_old_objects_misses(s3_env):
    # S3 times are whole seconds: an object's age reads up to a second more than it is, so a
    # 1 s TTL could expire an object read back at once; 2 s leaves that second and the read
    tier = open_tier(_url(s3_env, path="ttl", ttl=2, timeout=1), NS_A)
    key = make_key(1)
    assert tier.put(key, make_payload(key, 0, 100))
    assert tier.contains(key)
    time.sleep(3.1)
    assert not tier.contains(key)
    assert tier.get_into(key, np.zeros(100, np.uint8)) is None
    tier.close()


def test_defaults_store_at_once_on_a_fresh_bucket(s3_env):
    """The default bound fits an object store's first writes: none fails on a new bucket."""
    tier = open_tier(_url(s3_env, bucket="kvtier-fresh"), NS_A)
    try:
        assert tier.options.timeout >= 1.0 and tier.options.retries == 2
        items = [(make_key(i), make_payload(make_key(i), 0, 64 * 1024), None) for i in range(16)]
        assert tier.put_many([(k, p, RAW_META) for k, p, _ in items]) == [True] * 16
        assert all(tier.contains_many([k for k, _, _ in items]))
    finally:
        tier.close()


def test_a_store_failure_is_the_tiers_own_error(s3_env, monkeypatch):
    """A request the store refuses (here: wrong credentials) is TierUnavailableError at the
    tier's edge, one call or a batch, never the client library's exception nor the secret."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    tier = open_tier(_url(s3_env, optional=1), NS_A)
    try:
        assert tier.degraded
        with pytest.raises(TierUnavailableError, match="S3 store failed"):
            tier.put(make_key(1), make_payload(make_key(1), 0, 4096))
        batch = [(make_key(i), make_payload(make_key(i), 0, 4096), RAW_META) for i in range(3)]
        with pytest.raises(TierUnavailableError, match="S3 store failed") as info:
            tier.put_many(batch)
        assert "wrong-secret-value" not in str(info.value)
    finally:
        tier.close()
