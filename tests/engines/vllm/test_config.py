"""The connector's options: typed, checked when the engine starts, refused in one line."""

from __future__ import annotations

import json

import pytest

from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.open_tiers import tier_url
from kvtier.errors import ConfigError


def test_extra_config_is_typed_and_sizes_are_parsed(tmp_path):
    config = ConnectorConfig.from_extra(
        {
            "tiers": [f"slab://{tmp_path}/host?size=64MiB", f"slab://{tmp_path}/disk?size=1GiB"],
            "chunk_tokens": 512,
            "preload_bytes": "32MiB",
            "write": "back",
        }
    )
    assert config.chunk_tokens == 512
    assert config.preload_bytes == 32 << 20
    assert config.write == "back" and config.preload and config.store
    assert config.admit == "auto"


def test_a_config_file_gives_the_same_keys_and_extra_keys_override_it(tmp_path):
    path = tmp_path / "kvtier.json"
    path.write_text(json.dumps({"tiers": [f"slab://{tmp_path}/d?size=1GiB"], "chunk_tokens": 256}))
    config = ConnectorConfig.from_extra({"config": str(path), "chunk_tokens": 384})
    assert config.chunk_tokens == 384
    assert config.tiers == (f"slab://{tmp_path}/d?size=1GiB",)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({}, "needs tiers"),
        ({"tiers": ["memory://?size=1GiB"]}, "lives in one process"),
        ({"tiers": ["nosuch://x"]}, "nosuch"),
        ({"tiers": ["slab:///dev/shm/x?size=1GiB"], "chunk_tokens": "many"}, "chunk_tokens"),
        ({"tiers": ["slab:///dev/shm/x?size=1GiB"], "chunk_tokens": 0}, "chunk_tokens"),
        ({"tiers": ["slab:///dev/shm/x?size=1GiB"], "preload": "yes"}, "preload"),
        ({"tiers": ["slab:///dev/shm/x?size=1GiB"], "write": "sometimes"}, "write"),
        ({"tiers": ["slab:///dev/shm/x?size=1GiB"], "admit": "often"}, "admit"),
        ({"tiers": ["slab:///dev/shm/x?size=1GiB"], "colour": "blue"}, "unknown"),
        ({"tiers": ["slab:///dev/shm/x?size=1GiB"], "records": "/no/such/dir/r.jsonl"}, "records"),
        ({"config": "/no/such/kvtier.json"}, "cannot read"),
    ],
)
def test_bad_options_are_refused_with_what_to_give(extra, says):
    with pytest.raises(ConfigError, match=says):
        ConnectorConfig.from_extra(extra)


def test_a_host_memory_tier_is_named_host_unless_it_has_a_name():
    assert "name=host" in tier_url("slab:///dev/shm/kv?size=1GiB")
    assert "name=host" not in tier_url("slab:///var/kv?size=1GiB")
    assert "name=dram" in tier_url("slab:///dev/shm/kv?size=1GiB&name=dram")
    assert "codec=raw" in tier_url("slab:///dev/shm/kv?size=1GiB&name=dram")  # host memory
    assert "codec=raw" in tier_url("slab:///var/kv?size=1GiB")  # a disk: raw unless asked
    assert "codec=kv" in tier_url("slab:///var/kv?size=1GiB&codec=kv")
    assert "codec=raw" not in tier_url("slab:///dev/shm/kv?size=1GiB&codec=kv")  # as asked


def test_kv_role_narrows_what_the_connector_does():
    base = ConnectorConfig(tiers=("slab:///tmp/kvtier-role?size=1MiB",))
    assert base.for_role("kv_both") == base and base.for_role(None) == base
    producer = base.for_role("kv_producer")
    assert not producer.load and producer.store and producer.admit == "always"
    consumer = base.for_role("kv_consumer")
    assert consumer.load and not consumer.store
    with pytest.raises(ConfigError, match="kv_role 'kv_router'"):
        base.for_role("kv_router")


def test_layer_by_layer_is_on_for_gpu_kv_and_off_on_the_cpu_unless_given():
    tiers = ["slab:///dev/shm/x?size=1MiB"]
    auto = ConnectorConfig.from_extra({"tiers": tiers})
    assert auto.layerwise is None
    assert auto.resolved(on_gpu=True).layerwise is True
    assert auto.resolved(on_gpu=False).layerwise is False
    given = ConnectorConfig.from_extra({"tiers": tiers, "layerwise": True})
    assert given.resolved(on_gpu=False).layerwise is True
    with pytest.raises(ConfigError, match="layerwise"):
        ConnectorConfig.from_extra({"tiers": tiers, "layerwise": "yes"})
