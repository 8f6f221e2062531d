"""The cache scenarios over the real memory tier (fast) and the real disk tier (slow)."""

from __future__ import annotations

import pytest

from kvtier.testing.cache_conformance import CacheConformance


class TestMemoryOverDisk(CacheConformance):
    @pytest.fixture
    def fast_tier(self, memory_tier):
        return memory_tier

    @pytest.fixture
    def slow_tier(self, disk_tier):
        return disk_tier


class TestDiskOverDisk(CacheConformance):
    """A local NVMe tier in front of a second, larger disk tier (e.g. a network volume)."""

    @pytest.fixture
    def fast_tier(self, disk_tier):
        return disk_tier

    @pytest.fixture
    def slow_tier(self, disk_tier):
        return disk_tier
