"""kvtier's connector in the simulator: loads beyond the engine's cache, the cut, preloading."""

from dataclasses import replace

import pytest

from kvtier.sim.simulator import Simulator, simulate

from .helpers import BLOCK, TIMER, config, disk, dram, engine, kvtier, request, shared_prefix


def _pushed_out(tier_specs, **kv):
    """A long prompt, then enough others to push it out of a small engine pool, then it again."""
    first = shared_prefix(0.0, 40 * BLOCK, 40, "x")
    others = [request(1.0 + i, 40 * BLOCK, tag=str(i)) for i in range(3)]
    again = shared_prefix(10.0, 40 * BLOCK, 40, "y")
    cfg = config(engine=engine(blocks=48), kvtier=kvtier(*tier_specs, **kv))
    return simulate(cfg, [first, *others, again])


def test_a_prefix_pushed_out_of_the_engine_comes_back_from_the_first_tier():
    again = _pushed_out((dram(),)).records[-1]
    assert again.hit_tokens.get("dram", 0) >= 36 * BLOCK
    assert again.computed_tokens < 4 * BLOCK and again.decision == "load"
    alone = simulate(config(engine=engine(blocks=48)), [request(0.0, 40 * BLOCK)])
    assert again.ttft_s < alone.records[0].ttft_s


def test_a_tier_slower_than_recomputing_is_not_loaded_from():
    crawl = replace(disk(), read_bandwidth=1e3)  # a chunk takes 32 s to read
    again = _pushed_out((crawl,)).records[-1]
    assert again.decision == "recompute" and "disk" not in again.hit_tokens
    loaded = _pushed_out((crawl,), decide=False).records[-1]
    assert loaded.hit_tokens.get("disk", 0) > 0 and loaded.ttft_s > 10 * again.ttft_s


def test_every_completed_chunk_is_written_through_to_every_tier():
    result = _pushed_out((dram(), disk()))
    tiers = result.summary["tiers"]
    assert tiers["dram[0]"]["stored_blocks"] == tiers["disk[0]"]["stored_blocks"] > 0
    assert result.summary["links"]["disk[0]"]["bytes"] > 0


def test_a_queued_request_is_preloaded_from_disk_into_the_first_tier():
    sim = Simulator(
        config(kvtier=kvtier(dram(), disk())), [shared_prefix(0.0, 20 * BLOCK, 20, "z")]
    )
    r, conn = sim.requests[0], sim.replicas[0].connector
    for c in range(9):
        conn.by_name["disk"].hold(conn.chunk_key(r, c), conn.chunk_bytes)
    result = sim.run()
    assert conn.preloaded_chunks == 9 and result.records[0].hit_tokens.get("dram") == 9 * 2 * BLOCK


def test_prompts_that_repeat_nothing_stop_being_stored_and_a_repeat_is_stored():
    """admit=auto, as the connector: a window of one-shot prompts turns storing off for new
    chunks; a prompt repeating an earlier one's chunks stores those."""
    window = 16
    cfg = config(engine=engine(blocks=400), kvtier=kvtier(dram()))
    one_shot = [request(float(i), 8 * BLOCK, tag=f"o{i}") for i in range(window + 4)]
    repeat = shared_prefix(100.0, 8 * BLOCK, 8, "r")  # blocks p0..p7
    first = shared_prefix(50.0, 8 * BLOCK, 8, "f")  # the same prefix, seen first
    sim = Simulator(cfg, [*one_shot, first, repeat])
    conn = sim.replicas[0].connector
    assert conn.admission.sightings.window == window
    sim.run()
    # the prompts before the window filled were stored (4 chunks each); the one that filled it,
    # the four after it and the prefix's first sight were not; its repeat found the prefix in
    # the engine's own pool and computed only its last chunk, which it stored
    assert conn.stored_chunks == (window - 1) * 4 + 1
    assert conn.unadmitted_chunks == 5 * 4 + 4
    always = Simulator(replace(cfg, kvtier=kvtier(dram(), admit="always")), [*one_shot, first])
    always.run()
    assert always.replicas[0].connector.stored_chunks == (window + 5) * 4


def test_a_request_held_back_for_its_preload_goes_on_when_the_wait_is_over():
    # one chunk on a tier that reads it in 3.2 s: the preload outlasts the 2 s wait, and the
    # request is scheduled (recomputing) when the wait ends, not when the copy lands
    slow = replace(disk(), read_bandwidth=1e4, latency_s=0.0)
    sim = Simulator(config(kvtier=kvtier(dram(), slow)), [shared_prefix(0.0, 4 * BLOCK, 4, "w")])
    r, conn = sim.requests[0], sim.replicas[0].connector
    conn.by_name["disk"].hold(conn.chunk_key(r, 0), conn.chunk_bytes)
    record = sim.run().records[0]
    compute = TIMER.step_seconds([(4 * BLOCK, 0)], ())
    assert record.ttft_s == pytest.approx(conn.spec.preload_wait_s + compute)
    assert record.hit_tokens == {}
