"""The worker half on real tiers and tensors shaped like vLLM's CPU KV cache (no engine)."""

from __future__ import annotations

import shutil
import threading
import time
import uuid

import pytest
import torch

from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.identity import EngineGeometry
from kvtier.engines.vllm.metadata import ChunkLoad, KVTierMetadata, LoadJob, StoreJob
from kvtier.engines.vllm.worker import SPLIT_CHUNKS, WorkerSide
from kvtier.keys import Namespace

GEOMETRY = EngineGeometry(
    layers=3, kv_heads=2, head_dim=8, block_size=16, dtype="bfloat16", itemsize=2, layout="t"
)
NS = Namespace("test-model", "weights", "bfloat16", 3, 2, 8, layout="t")
CHUNK = 32  # two blocks


def open_worker(tmp_path, host_size: str = "8MiB", disk_size: str = "16MiB"):
    """A worker over a host-memory and a disk slab tier, with three layers of paged KV."""
    host = f"/dev/shm/kvtier-worker-{uuid.uuid4().hex[:8]}"
    config = ConnectorConfig(
        tiers=(f"slab://{host}?size={host_size}", f"slab://{tmp_path}/disk?size={disk_size}"),
        chunk_tokens=CHUNK,
        layerwise=True,  # the connector's default on GPUs; whole-request tests turn it off
    )
    side = WorkerSide(config, NS, GEOMETRY)
    gen = torch.Generator().manual_seed(0)
    caches = {
        f"model.layers.{i}.self_attn.attn": torch.randn(12, 2, 16, 16, generator=gen).to(
            torch.bfloat16
        )
        for i in (2, 0, 1)  # not in layer order: the worker orders them by layer number
    }
    side.register_kv_caches(caches)
    return side, [caches[f"model.layers.{i}.self_attn.attn"] for i in range(3)], host


@pytest.fixture
def worker(tmp_path):
    side, caches, host = open_worker(tmp_path)
    yield side, caches
    side.close()
    shutil.rmtree(host, ignore_errors=True)


def wait_finished(side, req_id: str) -> None:
    deadline = time.monotonic() + 10
    done: set[str] = set()
    while req_id not in done and time.monotonic() < deadline:
        done |= side.get_finished()
        time.sleep(0.01)
    assert req_id in done


def test_stored_blocks_come_back_bit_for_bit_into_other_blocks(worker):
    side, caches = worker
    key = b"k" * 16
    side.bind(KVTierMetadata(stores=[StoreJob("r1", (key,), ((3, 7),))]))
    side.wait_for_save()
    side.unbind()
    assert side.flush(10)
    # load the chunk's second block only (vLLM's own cache holds the first) into block 10
    job = LoadJob("r2", (ChunkLoad(key, (10,), skip=1),), (0,), sync=True)
    side.bind(KVTierMetadata(loads=[job]))
    side.start_load_kv()
    side.unbind()
    assert side.take_errors() == set()
    for layer in caches:
        assert torch.equal(layer[10].view(torch.int16), layer[7].view(torch.int16))


def test_saves_copy_into_buffers_the_writers_give_back_for_the_next_saves(worker):
    side, caches = worker
    keys = [bytes([i]) * 16 for i in range(3)]
    side.bind(KVTierMetadata(stores=[StoreJob("r1", tuple(keys), ((1, 2), (3, 4), (5, 6)))]))
    side.wait_for_save()
    side.unbind()
    assert side.flush(10)
    assert side._staging.idle == 3  # both tiers wrote them: back in the pool
    lent = side._staging.take(3)
    for buf in lent:  # scribbled on while idle: what the tiers hold does not change
        buf.fill(0xEE)
    for buf in lent:
        side._staging.give(buf)
    job = LoadJob("r2", (ChunkLoad(keys[1], (8, 9)),), (0,), sync=True)
    side.bind(KVTierMetadata(loads=[job]))
    side.start_load_kv()
    side.unbind()
    assert side.take_errors() == set()
    for layer in caches:
        assert torch.equal(layer[8:10].view(torch.int16), layer[3:5].view(torch.int16))


def test_a_load_reads_where_the_scheduler_found_each_chunk_without_looking_again(worker):
    side, caches = worker
    keys = [bytes([40 + i]) * 16 for i in range(3)]
    side.bind(KVTierMetadata(stores=[StoreJob("r1", tuple(keys), ((0, 1), (2, 3), (4, 5)))]))
    side.wait_for_save()
    side.unbind()
    assert side.flush(10)
    asked: list[int] = []
    for tier in side.cache.tiers:
        inner = tier.contains_many
        tier.contains_many = lambda ks, inner=inner: asked.append(len(ks)) or inner(ks)
    loads = tuple(ChunkLoad(k, (6 + 2 * i, 7 + 2 * i)) for i, k in enumerate(keys))
    side.bind(KVTierMetadata(loads=[LoadJob("r2", loads, (0, 0, 0), sync=True)]))
    side.start_load_kv()
    side.unbind()
    assert side.take_errors() == set() and asked == []
    for layer in caches:
        assert torch.equal(layer[6:12].view(torch.int16), layer[0:6].view(torch.int16))


def test_a_missing_chunk_is_reported_as_failed_blocks(worker):
    side, _ = worker
    job = LoadJob("r3", (ChunkLoad(b"x" * 16, (4, 5)),), (0,))
    side.bind(KVTierMetadata(loads=[job]))
    side.start_load_kv()
    side.unbind()
    wait_finished(side, "r3")
    assert side.take_errors() == {4, 5}


def test_a_promised_chunk_outlives_the_stores_made_while_its_load_waits(tmp_path):
    """Chunks stored while a load waits for its thread must not evict the chunks it will read."""
    side, caches, host = open_worker(tmp_path, host_size="64KiB", disk_size="64KiB")
    try:
        key = b"p" * 16
        side.bind(KVTierMetadata(stores=[StoreJob("r1", (key,), ((3, 7),))]))
        side.wait_for_save()
        assert side.flush(10)
        gate = threading.Event()
        busy = side._pool.submit(gate.wait, 10)  # the load thread is taken: the load waits
        side.bind(KVTierMetadata(loads=[LoadJob("r2", (ChunkLoad(key, (10, 11)),), (1,))]))
        side.start_load_kv()
        assert side.cache.is_pinned(key)
        others = [bytes([i]) * 16 for i in range(24)]  # several times what either tier holds
        side.bind(KVTierMetadata(stores=[StoreJob("r3", tuple(others), ((0, 1),) * 24)]))
        side.wait_for_save()
        assert side.flush(10)
        assert not any(t.contains(others[0]) for t in side.cache.tiers)  # stores did evict
        gate.set()
        busy.result()
        wait_finished(side, "r2")
        assert side.take_errors() == set() and not side.cache.is_pinned(key)
        for layer in caches:
            assert torch.equal(layer[10].view(torch.int16), layer[3].view(torch.int16))
            assert torch.equal(layer[11].view(torch.int16), layer[7].view(torch.int16))
    finally:
        side.close()
        shutil.rmtree(host, ignore_errors=True)


def test_the_forward_is_timed_without_the_synchronous_loads_before_it(worker):
    side, _ = worker
    key = b"t" * 16
    side.bind(KVTierMetadata(stores=[StoreJob("r1", (key,), ((0, 1),))]))
    side.wait_for_save()
    assert side.flush(10)
    side.take_report()
    job = LoadJob("r4", (ChunkLoad(key, (8, 9)),), (0,), sync=True)
    side.bind(KVTierMetadata(loads=[job], prefill=(64, 32)))
    side.start_load_kv()  # vLLM calls it before the forward when a load is synchronous
    time.sleep(0.2)  # the forward
    side.wait_for_save()
    (sample,) = side.take_report().prefills
    assert sample[:2] == (64, 32) and 0.2 <= sample[2] < 1.0


def test_a_long_synchronous_load_is_split_in_two_and_a_bad_chunk_fails_only_its_blocks(worker):
    side, caches = worker
    n = 2 * SPLIT_CHUNKS + 2  # every chunk holds blocks 0 and 1; loads reuse blocks 2..11
    keys = [bytes([i]) * 16 for i in range(n)]
    side.bind(KVTierMetadata(stores=[StoreJob("r1", tuple(keys), tuple((0, 1) for _ in keys))]))
    side.wait_for_save()
    side.unbind()
    assert side.flush(10)
    chunks = [ChunkLoad(k, (2 + (i % 5) * 2, 3 + (i % 5) * 2)) for i, k in enumerate(keys)]
    chunks[-2] = ChunkLoad(b"missing-chunk!!!", (40, 41))  # in the second half
    job = LoadJob("r2", tuple(chunks), tuple([0] * n), sync=True)
    side.bind(KVTierMetadata(loads=[job]))
    side.start_load_kv()
    side.unbind()
    assert side.take_errors() == {40, 41, chunks[-1].block_ids[0], chunks[-1].block_ids[1]}
    for layer in caches:
        assert torch.equal(layer[2].view(torch.int16), layer[0].view(torch.int16))
        assert torch.equal(layer[3].view(torch.int16), layer[1].view(torch.int16))


def test_the_host_memory_tier_takes_its_room_when_the_worker_opens_it(worker):
    side, _caches = worker
    host, disk = side.cache.tiers
    slot_files = list(host.root.glob("*.slab"))
    assert sum(p.stat().st_size for p in slot_files) > 8 * 2**20 - 2 * side.chunk_bytes - 8192
    assert not list(disk.root.glob("*.slab"))  # a disk tier grows as it fills


def test_the_tiers_rings_are_ready_for_a_chunk_when_the_worker_opens_them(worker):
    side, _caches = worker
    for tier in side.cache.tiers:
        if tier.io.name != "uring":
            pytest.skip("io_uring is not available here")
        rings = list(tier.io._free)  # a synchronous load's two halves and the store, at least
        assert len(rings) >= 3
        for ring in rings:
            staging = ring.short_slots.staging
            assert staging._array is not None and staging.size >= side.chunk_bytes


def _stored(side, keys_blocks) -> None:
    """Store chunks ``key → blocks`` and wait until every tier has them."""
    keys = tuple(k for k, _ in keys_blocks)
    side.bind(KVTierMetadata(stores=[StoreJob("s", keys, tuple(b for _, b in keys_blocks))]))
    side.wait_for_save()
    side.unbind()
    assert side.flush(10)


def test_a_waited_for_load_lands_layer_by_layer_and_each_wait_sees_its_layer(worker):
    """Layer by layer: the forward's wait for layer i returns with layer i's
    blocks in place; the step's end reports no errors and the load as finished in the step."""
    side, caches = worker
    assert side.config.layerwise
    a, b = b"a" * 16, b"b" * 16
    _stored(side, [(a, (1, 2)), (b, (3, 4))])
    job = LoadJob("r", (ChunkLoad(a, (8, 9)), ChunkLoad(b, (10, 11))), (0, 0), sync=True)
    side.bind(KVTierMetadata(loads=[job]))
    side.start_load_kv()
    for i in range(3):
        side.wait_for_layer_load(f"model.layers.{i}.self_attn.attn")
        layer = caches[i].view(torch.int16)
        for dst, src in ((8, 1), (9, 2), (10, 3), (11, 4)):
            assert torch.equal(layer[dst], layer[src]), (i, dst)
    side.wait_for_save()
    report = side.take_report()
    side.unbind()
    assert side.take_errors() == set()
    assert report is not None and [r for r, _ in report.synced] == ["r"]
    stats = side.take_stats()
    assert stats is not None and stats.data["counts"]["forward_blocked_seconds"] > 0


def test_a_waited_for_load_with_a_missing_chunk_places_the_rest_and_reports_the_gap(worker):
    side, caches = worker
    a = b"a" * 16
    _stored(side, [(a, (1, 2))])
    job = LoadJob("r", (ChunkLoad(a, (8, 9)), ChunkLoad(b"m" * 16, (10, 11))), (0, 0), sync=True)
    side.bind(KVTierMetadata(loads=[job]))
    side.start_load_kv()
    for i in range(3):  # no layer's wait hangs
        side.wait_for_layer_load(f"model.layers.{i}.self_attn.attn")
    side.wait_for_save()
    side.unbind()
    assert side.take_errors() == {10, 11}
    for layer in caches:
        assert torch.equal(layer[8].view(torch.int16), layer[1].view(torch.int16))


def test_a_load_that_raises_mid_way_ends_as_load_errors_and_frees_every_wait(worker):
    """A placement the engine refuses (a block past the pool) fails the whole step load:
    every layer's wait returns, and all its blocks are load errors vLLM recomputes."""
    side, _ = worker
    a = b"a" * 16
    _stored(side, [(a, (1, 2))])
    job = LoadJob("r", (ChunkLoad(a, (8, 99)),), (0,), sync=True)
    side.bind(KVTierMetadata(loads=[job]))
    side.start_load_kv()
    side.wait_for_layer_load("model.layers.1.self_attn.attn")
    side.wait_for_save()
    side.unbind()
    assert side.take_errors() == {8, 99}


def test_whole_request_loads_stay_behind_the_option(tmp_path):
    from dataclasses import replace

    side, caches, host = open_worker(tmp_path)
    try:
        side.config = replace(side.config, layerwise=False)
        a = b"a" * 16
        _stored(side, [(a, (1, 2))])
        side.bind(KVTierMetadata(loads=[LoadJob("r", (ChunkLoad(a, (8, 9)),), (0,), sync=True)]))
        side.start_load_kv()  # placed before it returns: nothing moves beside the forward
        assert side._step_load is None
        for layer in caches:
            assert torch.equal(layer[9].view(torch.int16), layer[2].view(torch.int16))
        side.wait_for_save()
        side.unbind()
        assert side.take_errors() == set()
    finally:
        side.close()
        shutil.rmtree(host, ignore_errors=True)


def test_sleep_mode_lets_go_of_the_caches_and_takes_them_back(worker):
    """vLLM 0.33's sleep mode: unregister drops the engine's views (twice is harmless), restore
    takes the same caches back, and loads work again."""
    side, caches = worker
    a = b"a" * 16
    _stored(side, [(a, (1, 2))])
    side.unregister_kv_caches()
    side.unregister_kv_caches()
    assert side.engine is None
    side.restore_kv_caches()
    side.restore_kv_caches()
    assert side.engine is not None
    side.bind(KVTierMetadata(loads=[LoadJob("r", (ChunkLoad(a, (8, 9)),), (0,), sync=True)]))
    side.start_load_kv()
    side.wait_for_save()
    side.unbind()
    assert side.take_errors() == set()
    assert torch.equal(caches[2][9].view(torch.int16), caches[2][2].view(torch.int16))


def _save_step(side, job: StoreJob, layers=range(3)) -> None:
    """A step that completes ``job``'s chunks: the forward reports ``layers`` done one by one."""
    side.bind(KVTierMetadata(stores=[job]))
    for i in layers:
        side.save_kv_layer(f"model.layers.{i}.self_attn.attn")
    side.wait_for_save()
    side.unbind()


def _load_back(side, key: bytes, into: tuple[int, int]) -> set[int]:
    side.bind(KVTierMetadata(loads=[LoadJob("back", (ChunkLoad(key, into),), (0,), sync=True)]))
    side.start_load_kv()
    side.wait_for_save()
    side.unbind()
    return side.take_errors()


@pytest.mark.parametrize("reported", [(0, 1, 2), (1,), ()])
def test_saves_copy_each_layer_as_the_forward_reports_it_and_store_the_same_bytes(worker, reported):
    """Layer by layer: the layers the forward reports are copied on the save
    thread, the rest after the step; what is stored is the blocks' bytes, whichever way."""
    side, caches = worker
    key = b"s" * 16
    _save_step(side, StoreJob("r1", (key,), ((3, 7),)), reported)
    assert side.flush(10)
    assert _load_back(side, key, (10, 11)) == set()
    for layer in caches:
        assert torch.equal(layer[10].view(torch.int16), layer[3].view(torch.int16))
        assert torch.equal(layer[11].view(torch.int16), layer[7].view(torch.int16))


def test_a_finished_request_is_reported_once_its_saves_are_out(worker):
    side, _ = worker
    gate = threading.Event()
    side._save_pool.submit(gate.wait, 10)  # the save thread is busy: the saves wait
    _save_step(side, StoreJob("r1", (b"f" * 16,), ((3, 7),)))
    assert side.get_finished_saving({"r1", "r-never-saved"}) == set()  # still copying
    assert side.get_finished_saving(set()) == set()
    gate.set()
    side.flush_saves()
    assert side.get_finished_saving(set()) == {"r1"}  # remembered from the earlier call
    assert side.get_finished_saving({"r1"}) == set()  # exactly once


def test_a_preempting_step_waits_for_the_saves_in_flight(worker):
    side, _ = worker
    gate = threading.Event()
    side._save_pool.submit(gate.wait, 10)
    _save_step(side, StoreJob("r1", (b"p" * 16,), ((3, 7),)))
    side.handle_preemptions(KVTierMetadata())  # no preemption: nothing to wait for
    assert not side._saving["r1"][0].done()
    threading.Timer(0.2, gate.set).start()
    side.handle_preemptions(KVTierMetadata(flush=True))
    assert side._saving["r1"][0].done()


def test_a_save_whose_layer_cannot_be_copied_stores_nothing(worker):
    side, _ = worker
    key = b"x" * 16
    _save_step(side, StoreJob("r1", (key,), ((3, 99),)))  # block 99 is not in the pool
    assert side.flush(10)
    assert not any(t.contains(key) for t in side.cache.tiers)
    assert side.take_stats().data["counts"]["dropped_chunks"] >= 1
    assert side.get_finished_saving({"r1"}) == {"r1"}  # vLLM gets its blocks back all the same


def test_whole_request_saves_are_out_when_the_step_ends(tmp_path):
    from dataclasses import replace

    side, _, host = open_worker(tmp_path)
    try:
        side.config = replace(side.config, layerwise=False)
        _save_step(side, StoreJob("r1", (b"w" * 16,), ((3, 7),)))
        assert side.cache.flush(10) and side.cache.tiers[0].contains(b"w" * 16)
        assert side.get_finished_saving({"r1"}) == set()  # vLLM never held its blocks
    finally:
        side.close()
        shutil.rmtree(host, ignore_errors=True)


def test_a_long_waited_for_load_is_read_in_two_halves_and_placed_whole(tmp_path):
    """A load of 2 × SPLIT_CHUNKS chunks or more is read as two halves at once; every chunk
    lands, and a chunk missing from the second half fails only its own blocks and the rest."""
    side, _, host = open_worker(tmp_path, host_size="16MiB")
    try:
        n = 2 * SPLIT_CHUNKS
        keys = [bytes([65 + i]) * 16 for i in range(n)]
        _stored(side, [(k, (1 + i % 5, 6)) for i, k in enumerate(keys)])
        missing = b"~" * 16
        chunks = [ChunkLoad(k, (7, 8)) for k in keys[:-1]] + [ChunkLoad(missing, (9, 10))]
        side.bind(KVTierMetadata(loads=[LoadJob("r", tuple(chunks), (0,) * n, sync=True)]))
        side.start_load_kv()
        side.wait_for_save()
        side.unbind()
        assert side.take_errors() == {9, 10}
    finally:
        side.close()
        shutil.rmtree(host, ignore_errors=True)


# --- loads straight into the engine's memory (file://…&gds=1) ----------------------------------
def open_straight_worker(tmp_path, layerwise: bool):
    """A worker over one file:// tier whose device verbs move bytes over POSIX: what gds=1
    does with kvikio on a GPU, here into the CPU KV."""
    from kvtier.tiers.files.device_io import PosixFileIO

    config = ConnectorConfig(
        tiers=(f"file://{tmp_path}/disk?size=16MiB&codec=raw",),
        chunk_tokens=CHUNK,
        layerwise=layerwise,
    )
    side = WorkerSide(config, NS, GEOMETRY)
    tier = side.cache.tiers[0]
    tier.device_io = PosixFileIO()
    reads: list[int] = []
    real = tier.read_device

    def counted(keys, outs):
        reads.append(len(keys))
        return real(keys, outs)

    tier.read_device = counted
    gen = torch.Generator().manual_seed(5)
    caches = [torch.randn(12, 2, 16, 16, generator=gen).to(torch.bfloat16) for _ in range(3)]
    side.register_kv_caches({f"model.layers.{i}.self_attn.attn": c for i, c in enumerate(caches)})
    return side, caches, tier, reads


@pytest.mark.parametrize("layerwise", [True, False])
def test_a_tier_that_reads_into_device_memory_serves_loads_straight(tmp_path, layerwise):
    side, caches, tier, reads = open_straight_worker(tmp_path, layerwise)
    try:
        a, b = b"a" * 16, b"b" * 16
        _stored(side, [(a, (1, 2)), (b, (3, 4))])
        assert tier.read_device([a], [torch.empty(side.chunk_bytes, dtype=torch.uint8)])[0]
        reads.clear()
        job = LoadJob("r", (ChunkLoad(a, (8, 9)), ChunkLoad(b, (10, 11))), (0, 0), sync=True)
        side.bind(KVTierMetadata(loads=[job]))
        side.start_load_kv()
        for i in range(3):
            side.wait_for_layer_load(f"model.layers.{i}.self_attn.attn")
        side.wait_for_save()
        side.unbind()
        assert side.take_errors() == set()
        assert reads == [2]  # both chunks read straight, none through the host path
        for layer in caches:
            for dst, src in ((8, 1), (9, 2), (10, 3), (11, 4)):
                assert torch.equal(layer[dst].view(torch.int16), layer[src].view(torch.int16))
    finally:
        side.close()


def test_a_damaged_block_read_straight_is_a_load_error_and_leaves_the_tier(tmp_path):
    side, caches, tier, _ = open_straight_worker(tmp_path, layerwise=True)
    try:
        a, b = b"a" * 16, b"b" * 16
        _stored(side, [(a, (1, 2)), (b, (3, 4))])
        with open(tier.block_path(b), "r+b") as f:
            f.seek(4096 + 100)
            byte = f.read(1)[0]
            f.seek(4096 + 100)
            f.write(bytes([byte ^ 0x40]))
        job = LoadJob("r", (ChunkLoad(a, (8, 9)), ChunkLoad(b, (10, 11))), (0, 0), sync=True)
        side.bind(KVTierMetadata(loads=[job]))
        side.start_load_kv()
        side.wait_for_save()
        side.unbind()
        assert side.take_errors() == {10, 11}  # the damaged chunk's blocks: vLLM recomputes
        for dst, src in ((8, 1), (9, 2)):
            assert torch.equal(caches[0][dst].view(torch.int16), caches[0][src].view(torch.int16))
        assert side.flush(10)
        assert tier.contains_many([a, b]) == [True, False]  # deleted, a miss from now on
    finally:
        side.close()
