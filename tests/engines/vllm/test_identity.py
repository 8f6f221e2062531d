"""The engine's KV geometry as both connector halves derive a chunk from it."""

from __future__ import annotations

import pytest

from kvtier.engines.vllm.identity import EngineGeometry
from kvtier.errors import ConfigError

GEOMETRY = EngineGeometry(30, 3, 64, 16, "bfloat16", 2, "vllm-cpu-test-block16")


def test_a_chunk_is_a_whole_number_of_vllm_blocks():
    assert GEOMETRY.blocks_per_chunk(256) == 16
    assert GEOMETRY.chunk_bytes(256) == 30 * 2 * 3 * 64 * 2 * 256
    for bad in (0, 24, 250):
        with pytest.raises(ConfigError, match="not a multiple of vLLM's block size 16"):
            GEOMETRY.blocks_per_chunk(bad)
