"""The cache scenarios with a shared tier (a real Redis, a real S3 server) behind host memory."""

from __future__ import annotations

import itertools

import pytest

from kvtier.testing.cache_conformance import NAMESPACE, CacheConformance
from kvtier.tiers.registry import open_tier

pytestmark = pytest.mark.services
_fresh = itertools.count()


def _shared_factory(url_of, tmp_path):
    opened = []

    def make(chunks: int = 1024, name: str = "shared"):
        prefix = f"c{tmp_path.name}-{next(_fresh)}"
        tier = open_tier(url_of(prefix, name), NAMESPACE.id)
        opened.append(tier)
        return tier

    return make, opened


@pytest.fixture
def redis_tier(redis_server, tmp_path):
    """Factory of Redis tiers, each under a key prefix of its own on the session's server."""
    make, opened = _shared_factory(
        lambda prefix, name: f"{redis_server.url}?prefix={prefix}&name={name}", tmp_path
    )
    yield make
    for tier in opened:
        tier.close()


@pytest.fixture
def s3_tier(s3_env, tmp_path):
    """Factory of S3 tiers, each under a prefix of its own in one bucket of the session's server."""
    make, opened = _shared_factory(
        lambda prefix, name: (
            f"s3://kvtier-cache/{prefix}?endpoint={s3_env.endpoint}&create=1&timeout=1&name={name}"
        ),
        tmp_path,
    )
    yield make
    for tier in opened:
        tier.close()


class TestMemoryOverRedis(CacheConformance):
    @pytest.fixture
    def fast_tier(self, memory_tier):
        return memory_tier

    @pytest.fixture
    def slow_tier(self, redis_tier):
        return redis_tier


class TestMemoryOverS3(CacheConformance):
    @pytest.fixture
    def fast_tier(self, memory_tier):
        return memory_tier

    @pytest.fixture
    def slow_tier(self, s3_tier):
        return s3_tier
