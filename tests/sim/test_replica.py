"""The replica's scheduler, as vLLM's: chunked prefill, prefix hits, preemption by recompute."""

import pytest

from kvtier.sim.simulator import simulate

from .helpers import BLOCK, TIMER, config, engine, request, shared_prefix


def test_one_request_alone_takes_its_chunked_prefill_then_one_step_per_token():
    r = simulate(config(), [request(0.0, 600, out=5)]).records[0]
    prefill = sum(TIMER.step_seconds([(n, c)], ()) for n, c in ((256, 0), (256, 256), (88, 512)))
    assert r.ttft_s == pytest.approx(prefill)
    assert r.tpot_s == pytest.approx(TIMER.step_seconds([], [600]), rel=0.01)
    assert r.computed_tokens == 600 and r.hit_tokens == {}


def test_a_shared_prefix_is_a_hit_of_whole_blocks_leaving_a_token_to_compute():
    reqs = [shared_prefix(0.0, 10 * BLOCK, 10, "a"), shared_prefix(5.0, 10 * BLOCK, 10, "b")]
    second = simulate(config(), reqs).records[1]
    assert second.hit_tokens == {"engine": 9 * BLOCK} and second.computed_tokens == BLOCK


def test_running_out_of_blocks_preempts_the_last_admitted_and_recomputes_it():
    # 12 blocks: two prompts of 5 blocks fit, their decodes then need more
    reqs = [request(0.0, 5 * BLOCK - 1, out=40, tag=t) for t in "ab"]
    result = simulate(config(engine=engine(blocks=12)), reqs)
    assert result.summary["preemptions"] >= 1
    victim = max(result.records, key=lambda r: r.preemptions)
    assert victim.rid == 1 and victim.recomputed_tokens > 0
    assert all(r.output_tokens == 40 for r in result.records)


def test_the_token_budget_and_sequence_limit_bound_a_step():
    reqs = [request(0.0, 200, out=2, tag=t) for t in "abc"]
    result = simulate(config(engine=engine(max_seqs=2)), reqs)
    first = sorted(result.records, key=lambda r: r.ttft_s)
    assert first[2].queue_wait_s > 0  # the third waited for a sequence slot


def test_a_waiting_request_is_admitted_only_when_its_whole_prompt_fits():
    # 40 blocks; the first request holds 10 and grows; the second's prompt needs 32 blocks,
    # its first chunk (the step's 256-token budget) only 16
    first = request(0.0, 10 * BLOCK - 1, out=30, tag="a")
    second = request(0.1, 32 * BLOCK - 1, out=2, tag="b")
    full = simulate(config(engine=engine(blocks=40)), [first, second])
    chunked = simulate(config(engine=engine(blocks=40, reserve_full_prompt=False)), [first, second])
    assert full.records[1].queue_wait_s > 0 and full.summary["preemptions"] == 0
    assert chunked.summary["preemptions"] >= 1  # admitted on its first chunk, blocks ran out


def test_two_asynchronous_loads_never_hold_the_blocks_each_other_needs():
    # 16 blocks; two 10-block prompts whose first 8 blocks (4 chunks) kvtier holds: the first
    # load takes 8 blocks, the second would take the 8 the first still needs
    from .helpers import dram, kvtier

    ids = {t: [f"{t}{i}" for i in range(10)] for t in "xy"}
    reqs = [
        request(0.0, 10 * BLOCK, out=2, ids=ids["x"]),
        request(0.5, 10 * BLOCK, out=2, ids=ids["y"]),
    ]
    reqs += [request(1.0, 10 * BLOCK, out=2, ids=ids[t][:8] + [f"{t}-again"] * 2) for t in "xy"]
    tiers = kvtier(dram(), admit="always", sync_first=False)
    result = simulate(config(engine=engine(blocks=16, prefix_caching=False), kvtier=tiers), reqs)
    assert result.summary["finished"] == 4
    assert [r.hit_tokens for r in result.records[2:]] == [{"dram": 8 * BLOCK}] * 2
