"""The scheduler half on real tiers with vLLM's own Request objects: what it plans and preloads.

vLLM's scheduler output and block lists are given as the plain data vLLM passes (the connector
reads only these fields); the tiers, keys, cost model and preloader are the real ones.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.identity import EngineGeometry
from kvtier.keys import ChunkKeyer, Namespace
from kvtier.testing.cache_conformance import fill_tier

vllm = pytest.importorskip("vllm")
from vllm import SamplingParams  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from kvtier.engines.vllm.scheduler import PRELOAD_AFTER_S, SchedulerSide  # noqa: E402

GEOMETRY = EngineGeometry(
    layers=2, kv_heads=1, head_dim=8, block_size=16, dtype="bfloat16", itemsize=2, layout="t"
)
CHUNK = 32
NS = Namespace("test-model", "weights", "bfloat16", 2, 1, 8, layout="t")


class Blocks:
    """vLLM's KVCacheBlocks as the connector reads it: one group of block ids."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def _empty_step() -> SimpleNamespace:
    cached = SimpleNamespace(
        req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]
    )
    return SimpleNamespace(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens={},
        total_num_scheduled_tokens=0,
        preempted_req_ids=None,
    )


@pytest.fixture
def dirs(tmp_path):
    host = f"/dev/shm/kvtier-sched-{uuid.uuid4().hex[:8]}"
    yield f"slab://{host}?size=8MiB", f"slab://{tmp_path}/disk?size=64MiB"
    shutil.rmtree(host, ignore_errors=True)


def _on_disk(disk_url: str, tokens: list[int]) -> list[bytes]:
    """Store the chunks of ``tokens`` in the disk tier only (as an earlier engine would)."""
    keys = ChunkKeyer(NS, CHUNK).keys(tokens)
    fill_tier(disk_url, NS, keys, GEOMETRY.chunk_bytes(CHUNK))
    return keys


def _request(tokens, rid="r1") -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=4), None)


def test_a_queued_requests_kv_is_preloaded_into_host_memory_and_then_loads_in_its_step(dirs):
    _host, disk = dirs
    tokens = list(range(1000, 1000 + 5 * CHUNK + 7))  # 5 full chunks and 7 tokens
    keys = _on_disk(disk, tokens)
    side = SchedulerSide(ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK), NS, GEOMETRY)
    try:
        req = _request(tokens)
        side.on_new_request(req)
        deadline = time.monotonic() + 10
        while side._reqs["r1"].preload != "done" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert side.cache.tiers[0].contains_many(keys) == [True] * 5  # moved up while queued
        # vLLM's own cache holds the first block (16 tokens): kvtier supplies the rest
        n, asynchronous = side.get_num_new_matched_tokens(req, 16)
        assert (n, asynchronous) == (5 * CHUNK - 16, False)  # host memory: loaded in its step
        side.update_state_after_alloc(req, Blocks(range(100, 111)), n)
        (job,) = side.build_connector_meta(_empty_step()).loads
        assert job.sync and [c.key for c in job.chunks] == keys
        assert job.chunks[0].skip == 1 and job.chunks[0].block_ids == (101,)
        assert job.block_ids == list(range(101, 110))  # blocks 1..9 of the request
    finally:
        side.close()


def test_without_preloading_a_disk_hit_loads_asynchronously_and_a_failed_chunk_is_not_retried(
    dirs,
):
    _host, disk = dirs
    tokens = list(range(2000, 2000 + 3 * CHUNK + 1))
    keys = _on_disk(disk, tokens)
    config = ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, preload=False)
    side = SchedulerSide(config, NS, GEOMETRY)
    try:
        req = _request(tokens)
        side.on_new_request(req)
        n, asynchronous = side.get_num_new_matched_tokens(req, 0)
        assert (n, asynchronous) == (3 * CHUNK, True)
        side.update_state_after_alloc(req, Blocks(range(10, 17)), n)
        (job,) = side.build_connector_meta(_empty_step()).loads
        assert [c.key for c in job.chunks] == keys and not job.sync
        # the worker reports chunk 1's blocks as failed: the request and the key are not retried
        side.update_connector_output(
            SimpleNamespace(
                finished_recving={"r1"}, invalid_block_ids={12, 13}, kv_connector_stats=None
            )
        )
        assert side.get_num_new_matched_tokens(req, 0) == (0, False)
        other = _request(tokens, "r2")
        side.on_new_request(other)
        assert side.get_num_new_matched_tokens(other, 0) == (CHUNK, True)  # up to the bad chunk
    finally:
        side.close()


def test_new_full_chunks_are_planned_for_storing_once(dirs):
    side = SchedulerSide(ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK), NS, GEOMETRY)
    try:
        tokens = list(range(3000, 3000 + 70))
        req = _request(tokens)
        side.on_new_request(req)
        assert side.get_num_new_matched_tokens(req, 0) == (0, False)
        side.update_state_after_alloc(req, Blocks(range(5)), 0)
        step = _empty_step()
        step.scheduled_new_reqs = [
            SimpleNamespace(req_id="r1", block_ids=(list(range(20, 25)),), num_computed_tokens=0)
        ]
        step.num_scheduled_tokens = {"r1": 70}
        meta = side.build_connector_meta(step)
        (store,) = meta.stores
        assert store.keys == tuple(ChunkKeyer(NS, CHUNK).keys(tokens))
        assert store.block_ids == ((20, 21), (22, 23))
        assert meta.prefill == (70, 0)
        again = _empty_step()  # the next (decode) step completes no new chunk
        again.scheduled_cached_reqs = SimpleNamespace(
            req_ids=["r1"], resumed_req_ids=set(), new_block_ids=[None], num_computed_tokens=[70]
        )
        again.num_scheduled_tokens = {"r1": 1}
        assert side.build_connector_meta(again).stores == []
    finally:
        side.close()


def test_a_request_is_not_held_back_while_its_preload_is_only_looking(dirs):
    """Holding a request back pays only while its KV is moving: a preload still looking for
    slower chunks gives way, and the request is scheduled at once (a miss here)."""
    side = SchedulerSide(ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK), NS, GEOMETRY)
    looking, release, looked = threading.Event(), threading.Event(), threading.Event()
    lookup = side.cache.lookup

    def slow_in_preloader(keys):
        if threading.current_thread().name != "kvtier-preload":
            return lookup(keys)
        looking.set()
        release.wait(10)
        try:
            return lookup(keys)
        finally:
            looked.set()

    side.cache.lookup = slow_in_preloader
    try:
        req = _request(list(range(4000, 4000 + 3 * CHUNK + 5)))
        side.on_new_request(req)
        assert looking.wait(10)  # the preloader is inside its lookup
        assert side.get_num_new_matched_tokens(req, 0) == (0, False)  # not None: not held
        release.set()
        assert looked.wait(10)
        time.sleep(0.05)  # the preloader's last steps after its lookup
        assert side._reqs["r1"].preload == ""  # the preload gave way and moved nothing
        stats = side.take_stats()
        assert stats is None or not stats.data["counts"].get("preload_holds")
    finally:
        release.set()
        side.close()


def _stored_chunks(side: SchedulerSide, tokens: list[int], rid: str) -> int:
    """Run a new request's lookup and its whole prefill step; chunks the step plans to store."""
    req = _request(tokens, rid)
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == (0, False)
    blocks = list(range(1, len(tokens) // GEOMETRY.block_size + 2))  # 0 is vLLM's null block
    side.update_state_after_alloc(req, Blocks(blocks), 0)
    step = _empty_step()
    step.scheduled_new_reqs = [
        SimpleNamespace(req_id=rid, block_ids=(blocks,), num_computed_tokens=0)
    ]
    step.num_scheduled_tokens = {rid: len(tokens)}
    stores = side.build_connector_meta(step).stores
    side.request_finished(req, blocks)
    return sum(len(job.keys) for job in stores)


@pytest.mark.parametrize("admit", ["auto", "repeat", "always"])
def test_chunks_no_earlier_prompt_held_are_stored_only_while_prompts_repeat(dirs, admit):
    """admit=auto stores every chunk until a window of prompts has passed with no repeat, then
    only chunks an earlier prompt held, until a prompt repeats one; repeat always stores only those;
    always stores everything. Nothing is looked up or stored in the tiers here (preload off)."""
    config = ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, preload=False, admit=admit)
    side = SchedulerSide(config, NS, GEOMETRY)
    window = side._admission.sightings.window
    rng = np.random.default_rng(7)

    def fresh(chunks: int) -> list[int]:
        return [int(t) for t in rng.integers(1000, 30000, chunks * CHUNK + 3)]

    try:
        first = fresh(8)
        stored = [_stored_chunks(side, first, "a0")]
        for i in range(1, window):  # distinct prompts until the window is full
            stored.append(_stored_chunks(side, fresh(8), f"a{i}"))
        after = _stored_chunks(side, fresh(8), "b")  # the window holds no repeat
        shared = first[: 5 * CHUNK] + fresh(3)  # five leading chunks repeat the first prompt's
        again = _stored_chunks(side, shared, "c")
        reopened = _stored_chunks(side, fresh(8), "d")
        stats = side.take_stats()
        unadmitted = stats.data["counts"].get("unadmitted_chunks", 0) if stats else 0
    finally:
        side.close()
    if admit == "always":
        assert stored == [8] * len(stored) and (after, again, reopened) == (8, 8, 8)
        assert unadmitted == 0
    elif admit == "auto":
        # nothing is known against storing until the window is full; the prompt that fills it
        # is the first one not stored
        assert stored == [8] * (window - 1) + [0]
        assert (after, again, reopened) == (0, 8, 8)  # a repeat reopens storing at once
        assert unadmitted == 8 + 8
    else:
        assert stored == [0] * window and (after, again, reopened) == (0, 5, 0)
        assert unadmitted == 8 * window + 8 + 3 + 8


def test_a_request_vllm_schedules_at_once_is_not_looked_up_again_by_the_preloader(dirs):
    """The preloader waits PRELOAD_AFTER_S before it looks a queued request up: one vLLM asks
    about first (the usual case with room in its pool) is looked up once, not twice."""
    side = SchedulerSide(ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK), NS, GEOMETRY)
    threads: list[str] = []
    lookup = side.cache.lookup

    def counted(keys):
        threads.append(threading.current_thread().name)
        return lookup(keys)

    side.cache.lookup = counted
    try:
        req = _request(list(range(5000, 5000 + 3 * CHUNK + 5)))
        side.on_new_request(req)
        assert side.get_num_new_matched_tokens(req, 0) == (0, False)
        time.sleep(4 * PRELOAD_AFTER_S)
        late = _request(list(range(6000, 6000 + 3 * CHUNK + 5)), "r2")
        side.on_new_request(late)  # vLLM leaves this one queued: the preloader looks it up
        deadline = time.monotonic() + 10
        while side._reqs["r2"].preload != "done" and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        side.close()
    assert threads.count("kvtier-preload") == 1 and len(threads) == 2


def test_preload_states_move_only_along_the_written_transitions():
    from kvtier.engines.vllm.scheduler import PRELOAD_MOVES, Preload, _Request

    st = _Request(None, 0.0)
    for state in (Preload.QUEUED, Preload.LOOKING, Preload.MOVING, Preload.DONE, Preload.NONE):
        st.move(state)
        assert st.preload is state
    with pytest.raises(AssertionError, match="preload"):
        st.move(Preload.MOVING)  # nothing moves for a request the preloader never looked up
    assert all(Preload.NONE in PRELOAD_MOVES[s] for s in Preload if s is not Preload.NONE)


def test_a_waiting_requests_lookup_is_remembered_until_something_changes(dirs):
    _host, disk = dirs
    tokens = list(range(3000, 3000 + 3 * CHUNK + 1))
    _on_disk(disk, tokens)
    config = ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, preload=False)
    side = SchedulerSide(config, NS, GEOMETRY)
    try:
        req = _request(tokens)
        side.on_new_request(req)
        first = side.get_num_new_matched_tokens(req, 0)
        assert first == (3 * CHUNK, True)
        asked = side.cache.metrics.lookups
        for _ in range(3):  # vLLM found no room for it and examines it again each step
            assert side.get_num_new_matched_tokens(req, 0) == first
        assert side.cache.metrics.lookups == asked  # no tier I/O
        # a block written through this engine's cache may change the answer: asked anew
        other = ChunkKeyer(NS, CHUNK).keys(list(range(9000, 9000 + CHUNK)))
        side.cache.store(other, [np.zeros(GEOMETRY.chunk_bytes(CHUNK), np.uint8)])
        assert side.cache.flush(10)
        assert side.get_num_new_matched_tokens(req, 0) == first
        assert side.cache.metrics.lookups == asked + 1
        # the worker reports blocks landed in its tiers (its own process): asked anew
        from kvtier.engines.vllm.metadata import KVTierWorkerMeta

        report = KVTierWorkerMeta(prefills=[(96, 0, 0.05)], changed=True)
        side.update_connector_output(
            SimpleNamespace(
                finished_recving=None,
                invalid_block_ids=None,
                kv_connector_stats=None,
                kv_connector_worker_meta=report,
            )
        )
        assert side.get_num_new_matched_tokens(req, 0) == first
        assert side.cache.metrics.lookups == asked + 2
        assert side.costs.prefill_samples == 1  # its measurement reached the cost model
        stats = side.take_stats()
        assert stats is not None and stats.data["counts"]["remembered_lookups"] == 3
    finally:
        side.close()
    # with no time to live every examination looks up (another engine may have stored)
    side = SchedulerSide(
        ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, preload=False, lookup_ttl_s=0), NS, GEOMETRY
    )
    try:
        req = _request(tokens, "r2")
        side.on_new_request(req)
        side.get_num_new_matched_tokens(req, 0)
        side.get_num_new_matched_tokens(req, 0)
        assert side.cache.metrics.lookups == 2
    finally:
        side.close()


def test_with_a_tier_across_the_network_lookups_run_off_the_loop(redis_server, dirs):
    host, _disk = dirs
    shared = f"{redis_server.url}?prefix=sched-{uuid.uuid4().hex[:8]}&timeout=1&name=redis"
    tokens = list(range(5000, 5000 + 2 * CHUNK + 3))
    keys = ChunkKeyer(NS, CHUNK).keys(tokens)
    fill_tier(shared, NS, keys, GEOMETRY.chunk_bytes(CHUNK))
    config = ConnectorConfig(tiers=(host, shared), chunk_tokens=CHUNK, preload=False)
    side = SchedulerSide(config, NS, GEOMETRY)
    try:
        req = _request(tokens)
        side.on_new_request(req)
        # EngineCore's loop never waits for Redis: "not yet" while the lookup is in flight
        assert side.get_num_new_matched_tokens(req, 0) == (None, False)
        pending = side._reqs["r1"].pending
        assert pending is not None
        pending.future.result(timeout=10)
        assert side.get_num_new_matched_tokens(req, 0) == (2 * CHUNK, True)
        asked = side.cache.metrics.lookups
        assert side.get_num_new_matched_tokens(req, 0) == (2 * CHUNK, True)  # remembered
        assert side.cache.metrics.lookups == asked == 1
        stats = side.take_stats()
        assert stats is not None and stats.data["counts"]["deferred_lookups"] == 1
    finally:
        side.close()


def _store_step(rid: str, n_tokens: int, blocks: list[int]) -> SimpleNamespace:
    step = _empty_step()
    step.scheduled_new_reqs = [
        SimpleNamespace(req_id=rid, block_ids=(blocks,), num_computed_tokens=0)
    ]
    step.num_scheduled_tokens = {rid: n_tokens}
    return step


def test_a_producer_never_loads_stores_every_chunk_and_says_how_many(dirs):
    _host, disk = dirs
    tokens = list(range(6000, 6000 + 2 * CHUNK + 5))
    _on_disk(disk, tokens)  # what it holds already is not loaded: a producer computes
    config = ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, admit="repeat", layerwise=True)
    side = SchedulerSide(config.for_role("kv_producer"), NS, GEOMETRY)
    try:
        req = _request(tokens)
        side.on_new_request(req)
        assert side.get_num_new_matched_tokens(req, 0) == (0, False)
        side.update_state_after_alloc(req, Blocks(range(1, 6)), 0)
        (store,) = side.build_connector_meta(_store_step("r1", len(tokens), [1, 2, 3, 4, 5])).stores
        assert len(store.keys) == 2  # every chunk, though no earlier prompt repeated them
        # its saves are copied out after the step: vLLM keeps its blocks until they are
        assert side.request_finished(req, [1, 2, 3, 4, 5]) == (True, {"kvtier_chunks": 2})
    finally:
        side.close()


def test_blocks_are_held_for_saves_only_when_saves_outlive_the_step(dirs):
    """With whole-request mode (``layerwise`` off) the step copies its chunks out before it
    ends, so a finished request's blocks go back at once; a request never saved is not held."""
    tokens = list(range(6000, 6000 + 2 * CHUNK + 5))
    for layerwise in (False, True):
        config = ConnectorConfig(
            tiers=dirs, chunk_tokens=CHUNK, admit="always", layerwise=layerwise
        )
        side = SchedulerSide(config, NS, GEOMETRY)
        try:
            req, idle = _request(tokens), _request(tokens[:5], "r2")
            for r in (req, idle):
                side.on_new_request(r)
                side.get_num_new_matched_tokens(r, 0)
            side.update_state_after_alloc(req, Blocks(range(1, 6)), 0)
            step = side.build_connector_meta(_store_step("r1", len(tokens), [1, 2, 3, 4, 5]))
            assert len(step.stores) == 1 and not step.flush
            assert side.request_finished(req, [1, 2, 3, 4, 5]) == (layerwise, None)
            assert side.request_finished(idle, [6]) == (False, None)
        finally:
            side.close()


def test_a_step_that_preempts_asks_the_workers_to_finish_their_saves(dirs):
    side = SchedulerSide(ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK), NS, GEOMETRY)
    try:
        step = _empty_step()
        step.preempted_req_ids = {"gone"}
        assert side.build_connector_meta(step).flush
        assert not side.build_connector_meta(_empty_step()).flush
    finally:
        side.close()


def _consumer(dirs, wait_s: float, tokens: list[int], chunks: int):
    """A consumer's scheduler half, and a request its producer said ``chunks`` chunks of."""
    config = ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, producer_wait_s=wait_s)
    side = SchedulerSide(config.for_role("kv_consumer"), NS, GEOMETRY)
    handed = {"kv_transfer_params": {"kvtier_chunks": chunks}}
    req = Request("r1", tokens, SamplingParams(max_tokens=4, extra_args=handed), None)
    side.on_new_request(req)
    return side, req


def test_a_consumer_waits_for_the_chunks_its_producer_stored_and_never_stores(dirs):
    _host, disk = dirs
    tokens = list(range(7000, 7000 + 3 * CHUNK + 3))
    side, req = _consumer(dirs, 30, tokens, 3)
    try:
        assert side.get_num_new_matched_tokens(req, 0) == (None, False)  # not stored yet
        _on_disk(disk, tokens)  # the producer's stores land
        deadline = time.monotonic() + 10
        got = side.get_num_new_matched_tokens(req, 0)
        while got == (None, False) and time.monotonic() < deadline:
            time.sleep(0.05)
            got = side.get_num_new_matched_tokens(req, 0)
        assert got[0] == 3 * CHUNK
        assert side.counters.take().data["counts"]["producer_waits"] >= 1
        side.update_state_after_alloc(req, Blocks(range(1, 8)), got[0])
        assert side.build_connector_meta(_store_step("r1", len(tokens), [1, 2, 3, 4])).stores == []
        assert side.request_finished(req, [1, 2, 3, 4]) == (False, None)
    finally:
        side.close()


def test_a_consumer_stops_waiting_after_producer_wait_s_and_computes(dirs):
    side, req = _consumer(dirs, 0.2, list(range(8000, 8000 + 2 * CHUNK + 3)), 2)
    try:
        assert side.get_num_new_matched_tokens(req, 0) == (None, False)
        time.sleep(0.3)
        assert side.get_num_new_matched_tokens(req, 0) == (0, False)  # never stored: computed
    finally:
        side.close()


class TwoGroups:
    """vLLM's KVCacheBlocks with two KV-cache groups (full attention, sliding window)."""

    def __init__(self, full, sliding):
        self.ids = (list(full), list(sliding))

    def get_block_ids(self):
        return self.ids


def test_with_two_kv_cache_groups_loads_and_stores_name_each_groups_blocks(dirs):
    _host, disk = dirs
    tokens = list(range(9000, 9000 + 3 * CHUNK + 5))
    keys = _on_disk(disk, tokens)
    config = ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, preload=False)
    side = SchedulerSide(config, NS, GEOMETRY)
    try:
        req = _request(tokens)
        side.on_new_request(req)
        n, _ = side.get_num_new_matched_tokens(req, 0)
        assert n == 3 * CHUNK
        # the sliding window's blocks before its window are vLLM's null block (0)
        side.update_state_after_alloc(req, TwoGroups(range(10, 17), [0, 0, 0, 0, 20, 21, 22]), n)
        (job,) = side.build_connector_meta(_empty_step()).loads
        assert [c.key for c in job.chunks] == keys
        assert job.chunks[0].group_ids(1) == (0, 0) and job.chunks[2].group_ids(1) == (20, 21)
        assert job.block_ids == list(range(10, 16))  # the first group's, for the accounting
        assert 0 not in job.all_block_ids()
        # a new request's chunk whose sliding-window block vLLM already dropped is not stored
        other = _request(list(range(11000, 11000 + 2 * CHUNK + 1)), "r2")
        side.on_new_request(other)
        side.get_num_new_matched_tokens(other, 0)
        side.update_state_after_alloc(other, TwoGroups(range(30, 35), range(40, 45)), 0)
        step = _empty_step()
        step.scheduled_new_reqs = [
            SimpleNamespace(
                req_id="r2",
                block_ids=([30, 31, 32, 33, 34], [0, 0, 42, 43, 44]),
                num_computed_tokens=0,
            )
        ]
        step.num_scheduled_tokens = {"r2": 2 * CHUNK + 1}
        (store,) = side.build_connector_meta(step).stores
        assert len(store.keys) == 1 and store.group_ids(0, 0) == (32, 33)
        assert store.group_ids(0, 1) == (42, 43)
        assert side.take_stats().data["counts"]["unstorable_chunks"] == 1
    finally:
        side.close()


def test_a_ranks_load_errors_that_come_before_the_others_finish_still_fail_the_load(dirs):
    """With tensor parallelism vLLM reports a request finished loading once every rank did,
    while a rank's failed blocks arrive with its own step: the load still counts them."""
    _host, disk = dirs
    tokens = list(range(12000, 12000 + 2 * CHUNK + 1))
    _on_disk(disk, tokens)
    side = SchedulerSide(
        ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK, preload=False), NS, GEOMETRY
    )
    try:
        req = _request(tokens)
        side.on_new_request(req)
        n, _ = side.get_num_new_matched_tokens(req, 0)
        side.update_state_after_alloc(req, Blocks(range(1, 6)), n)
        side.build_connector_meta(_empty_step())
        out = SimpleNamespace(
            finished_recving=None, invalid_block_ids={3, 4}, kv_connector_stats=None
        )
        side.update_connector_output(out)  # one rank failed chunk 1; the others still load
        done = SimpleNamespace(
            finished_recving={"r1"}, invalid_block_ids=set(), kv_connector_stats=None
        )
        side.update_connector_output(done)
        counts = side.take_stats().data["counts"]
        assert counts["loaded_tokens"] == CHUNK  # chunk 0 only
        assert side.get_num_new_matched_tokens(req, 0) == (0, False)  # it recomputes now
        other = _request(tokens, "r2")
        side.on_new_request(other)
        assert side.get_num_new_matched_tokens(other, 0) == (CHUNK, True)  # chunk 1 not offered
    finally:
        side.close()


def test_a_preload_into_host_memory_is_announced_as_a_kv_event(dirs):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import (
        get_request_block_hasher,
        init_none_hash,
        maybe_convert_block_hash,
    )

    _host, disk = dirs
    tokens = list(range(13000, 13000 + 2 * CHUNK + 3))
    keys = _on_disk(disk, tokens)
    side = SchedulerSide(ConnectorConfig(tiers=dirs, chunk_tokens=CHUNK), NS, GEOMETRY, True)
    try:
        init_none_hash(sha256)
        hasher = get_request_block_hasher(GEOMETRY.block_size, sha256)
        req = Request("r1", tokens, SamplingParams(max_tokens=4), None, block_hasher=hasher)
        side.on_new_request(req)
        deadline = time.monotonic() + 10
        while side._reqs["r1"].preload != "done" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert side.cache.flush(10) and side.cache.tiers[0].contains_many(keys) == [True, True]
        events = side.take_events()
        assert [e.ownership for e in events] == ["host", "host"]
        assert all(e.medium == "CPU" and e.block_size == GEOMETRY.block_size for e in events)
        hashes = [maybe_convert_block_hash(h) for h in req.block_hashes[:4]]
        assert [e.block_hashes for e in events] == [hashes[0:2], hashes[2:4]]
        assert side.take_events() == []
    finally:
        side.close()
