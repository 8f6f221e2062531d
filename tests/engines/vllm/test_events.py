"""kvtier's KV events: vLLM's block hashes for a chunk, what a worker's real tiers store and
evict as BlockStored/BlockRemoved, and the scheduler's merge of every rank's events. A real
engine's events, as a ZMQ subscriber hears them, are checked in test_tensor_parallel."""

from __future__ import annotations

import shutil
import uuid

import pytest
import torch

vllm = pytest.importorskip("vllm")
from vllm import SamplingParams  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved, BlockStored  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.request import Request  # noqa: E402

from kvtier.engines.vllm.config import ConnectorConfig  # noqa: E402
from kvtier.engines.vllm.events import (  # noqa: E402
    KVTierEvents,
    SchedulerEvents,
    TierPlace,
    chunk_blocks,
)
from kvtier.engines.vllm.identity import EngineGeometry  # noqa: E402
from kvtier.engines.vllm.metadata import KVTierMetadata, StoreJob  # noqa: E402
from kvtier.engines.vllm.worker import WorkerSide  # noqa: E402
from kvtier.keys import Namespace  # noqa: E402

BS = 16
GEOMETRY = EngineGeometry(3, 1, 8, BS, "bfloat16", 2, "t")
NS = Namespace("test-model", "weights", "bfloat16", 3, 1, 8, layout="t")


def hashed_request(tokens: list[int]) -> Request:
    init_none_hash(sha256)
    return Request(
        "r1",
        tokens,
        SamplingParams(max_tokens=1),
        None,
        block_hasher=get_request_block_hasher(BS, sha256),
    )


def test_a_chunk_is_named_by_vllms_own_block_hashes():
    req = hashed_request(list(range(100, 100 + 5 * BS)))
    first = chunk_blocks(req, 0, 2, BS)
    second = chunk_blocks(req, 1, 2, BS)
    assert first is not None and second is not None
    external = [maybe_convert_block_hash(h) for h in req.block_hashes]  # as vLLM publishes them
    assert list(first.hashes) == external[:2] and first.parent is None
    assert list(second.hashes) == external[2:4] and second.parent == external[1]
    assert second.tokens == tuple(range(100 + 2 * BS, 100 + 4 * BS))
    assert chunk_blocks(req, 2, 2, BS) is None  # its second block is not full: not hashed


def test_tiers_are_placed_as_vllm_names_media():
    assert TierPlace.of("slab:///dev/shm/kv?size=1MiB", "host", False) == TierPlace(
        "host", "CPU", "LOCAL"
    )
    assert TierPlace.of("slab:///nvme/kv?size=1MiB", "disk", False).medium == "STORAGE"
    assert TierPlace.of("redis://127.0.0.1:1/0", "redis", True).locality == "REMOTE"


def test_a_workers_tiers_announce_what_they_store_and_evict(tmp_path):
    host = f"/dev/shm/kvtier-events-{uuid.uuid4().hex[:8]}"
    config = ConnectorConfig(
        tiers=(f"slab://{host}?size=64KiB", f"slab://{tmp_path}/disk?size=16MiB"),
        chunk_tokens=2 * BS,
    )
    side = WorkerSide(config, NS, GEOMETRY, events=True)
    try:
        side.register_kv_caches(
            {f"layers.{i}.attn": torch.zeros(12, 1, BS, 16, dtype=torch.bfloat16) for i in range(3)}
        )
        n = 24  # several times what the host tier holds: it evicts
        req = hashed_request(list(range(7, 7 + n * 2 * BS)))
        blocks = tuple(chunk_blocks(req, c, 2, BS) for c in range(n))
        keys = tuple(bytes([c]) * 16 for c in range(n))
        side.bind(KVTierMetadata(stores=[StoreJob("r1", keys, ((0, 1),) * n, blocks=blocks)]))
        side.wait_for_save()
        side.unbind()
        assert side.flush(10)
        events = side.take_events().get_all_events()
        stored = [e for e in events if isinstance(e, BlockStored)]
        removed = [e for e in events if isinstance(e, BlockRemoved)]
        assert {(e.medium, e.ownership) for e in stored} == {("CPU", "host"), ("STORAGE", "slab")}
        on_disk = [e for e in stored if e.ownership == "slab"]
        assert sorted(tuple(e.block_hashes) for e in on_disk) == sorted(b.hashes for b in blocks)
        assert all(e.block_size == BS and e.locality == "LOCAL" for e in stored)
        assert removed and {(e.medium, e.ownership) for e in removed} == {("CPU", "host")}
        assert side.take_events() is None  # taken once
    finally:
        side.close()
        shutil.rmtree(host, ignore_errors=True)


def _stored(h: bytes, tier: str = "host") -> BlockStored:
    return BlockStored(
        block_hashes=[h],
        parent_block_hash=None,
        token_ids=[1],
        block_size=BS,
        lora_id=None,
        medium="CPU",
        lora_name=None,
        ownership=tier,
    )


def test_a_chunk_is_announced_once_every_rank_stored_it_and_gone_once_one_lost_it():
    merge = SchedulerEvents(ranks=3)
    merge.add(KVTierEvents([_stored(b"a"), _stored(b"a"), _stored(b"b")], workers=3))
    assert merge.take() == []  # one rank's part of "a" has not landed yet
    merge.add(KVTierEvents([_stored(b"a")]))
    assert merge.take() == [_stored(b"a")]
    gone = BlockRemoved(block_hashes=[b"a"], medium="CPU", ownership="host")
    merge.add(
        KVTierEvents([gone, BlockRemoved(block_hashes=[b"a"], medium="CPU", ownership="host")])
    )
    merge.add(KVTierEvents([gone]))  # the other ranks drop their parts after it: told once
    assert merge.take() == [gone]
    merge.add(None)
    assert merge.take() == []
