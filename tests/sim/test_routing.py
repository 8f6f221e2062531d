"""Routing a fleet: each policy's choice, hit rate and TTFT on small traces worked out by hand,
a burst spread over the fleet, and the same result for the same seed whatever the hash seed."""

import json
import subprocess
import sys

import pytest

from kvtier.errors import ConfigError
from kvtier.sim.request import SimRequest, engine_keys
from kvtier.sim.simulator import Simulator, simulate

from .helpers import TIMER, config, dram, engine, kvtier, request

# TIMER: a step costs 0.01 s + 1e-4 s per token; the engine runs up to 256 tokens a step
STEP_S, TOKEN_S = 0.01, 1e-4


def _two_turns(prefix_blocks: int = 6):
    """A at 0 s and B at 1 s (after A's answer): 128-token prompts whose first
    ``prefix_blocks`` 16-token blocks are the same, one output token each."""
    shared = [f"p{i}" for i in range(prefix_blocks)]
    a = request(0.0, 128, out=1, ids=shared + [f"a{i}" for i in range(8 - prefix_blocks)])
    b = request(1.0, 128, out=1, ids=shared + [f"b{i}" for i in range(8 - prefix_blocks)])
    return [a, b]


def test_prefix_routing_sends_a_prompt_to_the_engine_that_holds_its_prefix():
    reqs = _two_turns()
    cold = simulate(config(replicas=2, routing="least-loaded"), reqs)
    warm = simulate(config(replicas=2, routing="prefix"), reqs)
    # least-loaded: both idle, B goes to the replica after A's and computes all 128 tokens
    assert [r.replica for r in cold.records] == [0, 1]
    assert cold.records[1].ttft_s == pytest.approx(STEP_S + 128 * TOKEN_S)
    assert cold.summary["hit_rate"] == {}
    # prefix: B goes to A's replica, finds 6 blocks (96 tokens) and computes the other 32
    assert [r.replica for r in warm.records] == [0, 0]
    assert warm.records[0].ttft_s == pytest.approx(STEP_S + 128 * TOKEN_S)
    assert warm.records[1].ttft_s == pytest.approx(STEP_S + 32 * TOKEN_S)
    assert warm.summary["hit_rate"] == {"engine": pytest.approx(96 / 256)}


def _tier_fleet(routing: str):
    """Two replicas without a prefix cache, each with its own DRAM tier that stores every
    chunk (two blocks, 32 tokens, 32 kB)."""
    return config(
        engine=engine(prefix_caching=False),
        kvtier=kvtier(dram(), admit="always"),
        replicas=2,
        routing=routing,
    )


# the DRAM tier reads at 10 GB/s after 1 µs: three chunks (96 tokens, 96 kB) in 10.6 µs
LOAD_3_S = 1e-6 + 96 * 1000 / 10e9


def test_tier_routing_counts_what_a_replicas_own_tier_holds_by_its_load_time():
    reqs = _two_turns()
    blind = simulate(_tier_fleet("prefix"), reqs)  # no engine holds anything: least loaded
    aware = simulate(_tier_fleet("tier"), reqs)
    assert [r.replica for r in blind.records] == [0, 1]
    assert blind.records[1].ttft_s == pytest.approx(STEP_S + 128 * TOKEN_S)
    assert blind.summary["hit_rate"] == {}
    # tier: B goes where its three chunks are, loads them (in the step) and computes 32 tokens
    assert [r.replica for r in aware.records] == [0, 0]
    assert aware.records[1].ttft_s == pytest.approx(LOAD_3_S + STEP_S + 32 * TOKEN_S)
    assert aware.records[1].hit_tokens == {"dram": 96}
    assert aware.summary["hit_rate"] == {"dram": pytest.approx(96 / 256)}


def test_the_tier_score_is_the_load_or_the_recompute_plus_the_queue():
    a, b = _two_turns()
    sim = Simulator(_tier_fleet("tier"), [a])
    sim.run()
    router = sim.router
    rep0, rep1 = sim.replicas
    nxt = SimRequest(rid=1, trace=b, keys=engine_keys(b, 16), due_s=1.0, output=1)
    assert router.tier_score(rep1, nxt, 1.0) == pytest.approx(STEP_S + 128 * TOKEN_S)
    assert router.tier_score(rep0, nxt, 1.0) == pytest.approx(LOAD_3_S + STEP_S + 32 * TOKEN_S)
    assert router.choose(nxt, 1.0) is rep0
    # 512 prompt tokens queued on replica 0: at its full-step rate (256 tokens in 0.0356 s)
    queued = request(1.0, 512, tag="queued")
    rep0.waiting.append(SimRequest(rid=2, trace=queued, keys=[], due_s=1.0, output=1))
    token_s = (STEP_S + 256 * TOKEN_S) / 256
    assert router.tier_score(rep0, nxt, 1.0) == pytest.approx(
        LOAD_3_S + STEP_S + 32 * TOKEN_S + 512 * token_s
    )
    assert router.choose(nxt, 1.0) is rep1


@pytest.mark.parametrize("routing", ["least-loaded", "prefix", "tier"])
def test_a_burst_sent_at_one_instant_spreads_over_the_fleet(routing):
    reqs = [request(0.0, 64, tag=str(i)) for i in range(6)]
    result = simulate(config(replicas=3, routing=routing), reqs)
    assert [r.replica for r in result.records] == [0, 1, 2, 0, 1, 2]


def test_round_robin_takes_each_replica_in_turn():
    reqs = [request(float(i), 64, tag=str(i)) for i in range(4)]
    result = simulate(config(replicas=3, routing="round-robin"), reqs)
    assert [r.replica for r in result.records] == [1, 2, 0, 1]


def test_an_unknown_routing_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="session, least-loaded, round-robin, prefix, tier"):
        config(replicas=2, routing="nearest")


def test_the_same_seed_gives_the_same_json_whatever_the_hash_seed():
    code = (
        "import json, sys; sys.path.insert(0, 'tests');"
        "from dataclasses import replace;"
        "from sim.test_simulator import _mix;"
        "from sim.helpers import config, disk, dram, engine, kvtier;"
        "from kvtier.sim.simulator import simulate;"
        "shared = replace(disk(capacity=None), shared=True);"
        "cfg = config(engine=engine(blocks=512), kvtier=kvtier(dram(capacity=2e6), shared),"
        "replicas=3, routing=sys.argv[1]);"
        "r = simulate(cfg, _mix()).to_dict(); r.pop('run'); print(json.dumps(r))"
    )
    for routing in ("prefix", "tier"):
        outs = set()
        for seed in ("1", "2"):
            env = {"PYTHONHASHSEED": seed, "PATH": ""}
            run = [sys.executable, "-c", code, routing]
            outs.add(
                subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout
            )
        assert len(outs) == 1
        s = json.loads(outs.pop())["summary"]
        assert s["finished"] > 100 and s["finished"] + s["rejected"] == s["requests"]


def test_helpers_timer_is_the_one_the_hand_figures_use():
    assert TIMER.step_seconds([(128, 0)], ()) == pytest.approx(STEP_S + 128 * TOKEN_S)
