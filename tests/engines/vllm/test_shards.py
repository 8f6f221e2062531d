"""Tensor-parallel parts of a chunk: keys apart per rank, lookups of whole chunks, and ranks that
drop their parts of a chunk another rank lost (three real worker halves on shared tiers)."""

from __future__ import annotations

import shutil
import uuid
from dataclasses import replace

import torch

from kvtier.cache.results import LookupResult
from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.identity import EngineGeometry
from kvtier.engines.vllm.metadata import ChunkLoad, KVTierMetadata, LoadJob, StoreJob
from kvtier.engines.vllm.shards import PartBook, Shards
from kvtier.engines.vllm.worker import WorkerSide
from kvtier.keys import Namespace

NS1 = Namespace("test-model", "weights", "bfloat16", 3, 1, 8, layout="t")
NS3 = replace(NS1, tp_size=3)
GEOMETRY = EngineGeometry(3, 1, 8, 16, "bfloat16", 2, "t", tp_size=3)
CHUNK = 32  # two blocks


def test_one_rank_keys_parts_as_the_chunks_themselves():
    shards = Shards(NS1)
    keys = [b"a" * 16, b"b" * 16]
    assert shards.size == 1
    assert shards.every_part(keys) == keys and shards.keys(keys, 0) == keys


def test_each_rank_has_its_own_part_keys_and_tp_sizes_never_share_one():
    three, two = Shards(NS3), Shards(replace(NS1, tp_size=2))
    key = b"k" * 16
    parts = [three.key(key, r) for r in range(3)]
    assert len(set(parts)) == 3 and key not in parts
    assert not set(parts) & {two.key(key, r) for r in range(2)}
    assert three.every_part([key, b"j" * 16])[:3] == parts
    assert Shards(replace(NS3, tp_rank=2)).key(key, 1) == parts[1]  # the engine's, any rank


def test_a_chunk_counts_only_with_every_part_and_sits_in_its_slowest_parts_tier():
    shards = Shards(NS3)
    names = ("host", "disk")
    # chunk 0: parts in host, host, disk; chunk 1: two of three parts found
    found = LookupResult(9, [0, 0, 1, 0, 0], names, chunk_tokens=CHUNK)
    whole = shards.whole(found)
    assert whole.tiers == [1] and whole.requested == 3 and whole.hit_tokens == CHUNK
    assert shards.partial(found) == 1
    assert shards.partial(LookupResult(9, [0, 0, 0], names)) is None


def test_the_part_book_forgets_the_oldest_parts_past_its_capacity():
    book = PartBook(capacity=2)
    book.remember([b"1", b"2", b"3"], [b"a", b"b", b"c"])
    assert book.chunk(b"1") is None and book.chunk(b"3") == b"c" and len(book) == 2


def open_rank(rank: int, host: str, disk: str, host_size: str = "8MiB") -> WorkerSide:
    config = ConnectorConfig(
        tiers=(f"slab://{host}?size={host_size}&rescan=0", f"slab://{disk}?size=16MiB&rescan=0"),
        chunk_tokens=CHUNK,
    )
    side = WorkerSide(config, NS3, GEOMETRY, rank=rank)
    gen = torch.Generator().manual_seed(rank)
    side.register_kv_caches(
        {
            f"model.layers.{i}.attn": torch.randn(12, 1, 16, 16, generator=gen).to(torch.bfloat16)
            for i in range(3)
        }
    )
    return side


def step(side: WorkerSide, meta: KVTierMetadata) -> None:
    side.bind(meta)
    side.start_load_kv()
    side.wait_for_save()
    side.unbind()


def test_three_ranks_store_and_load_their_own_parts_of_one_chunk(tmp_path):
    host = f"/dev/shm/kvtier-shards-{uuid.uuid4().hex[:8]}"
    ranks = [open_rank(r, host, str(tmp_path / "disk")) for r in range(3)]
    try:
        key = b"c" * 16
        for side in ranks:
            step(side, KVTierMetadata(stores=[StoreJob("r1", (key,), ((2, 5),))]))
            assert side.flush(10)
        shards = Shards(NS3)
        found = ranks[0].cache.lookup(shards.every_part([key]))
        assert shards.whole(found).hit_chunks == 1
        load = LoadJob("r2", (ChunkLoad(key, (9, 10)),), (0,), sync=True)
        for side in ranks:
            step(side, KVTierMetadata(loads=[load]))
            assert side.take_errors() == set()
            caches = side.engine._views
            for layer in caches:  # its own part: the blocks it stored itself
                assert (layer[9] == layer[2]).all() and (layer[10] == layer[5]).all()
        # rank 0's and rank 1's own heads differ: each read its part, not another rank's
        assert not (ranks[0].engine._views[0][9] == ranks[1].engine._views[0][9]).all()
    finally:
        for side in ranks:
            side.close()
        shutil.rmtree(host, ignore_errors=True)


def test_a_part_evicted_on_one_rank_is_reported_and_the_others_drop_theirs(tmp_path):
    host = f"/dev/shm/kvtier-shards-{uuid.uuid4().hex[:8]}"
    lean = open_rank(0, host, str(tmp_path / "disk"), host_size="64KiB")
    other = open_rank(1, host, str(tmp_path / "disk"))
    try:
        keys = [bytes([i]) * 16 for i in range(24)]  # several times what the lean host holds
        jobs = [StoreJob("r1", tuple(keys), ((0, 1),) * len(keys))]
        for side in (lean, other):
            step(side, KVTierMetadata(stores=jobs))
            assert side.flush(10)
        evicted = lean.take_report().evicted
        assert evicted and {tier for _, tier in evicted} == {"host"}
        gone = evicted[0][0]
        shards = Shards(NS3)
        part = shards.key(gone, 1)
        assert other.cache.tiers[0].contains(part)
        step(other, KVTierMetadata(discards=[(gone, "host")]))
        assert other.flush(10)
        assert not other.cache.tiers[0].contains(part)  # gone from the host tier only
        assert other.cache.tiers[1].contains(part)
        step(other, KVTierMetadata(discards=[(gone, "")]))
        assert other.flush(10)
        assert not any(t.contains(part) for t in other.cache.tiers)
    finally:
        for side in (lean, other):
            side.close()
        shutil.rmtree(host, ignore_errors=True)
