"""The event loop: the client's concurrency, closed-loop sessions, replicas, determinism."""

import subprocess
import sys

import pytest

from kvtier.errors import ConfigError
from kvtier.sim.simulator import simulate
from kvtier.workloads.synthetic import MixSpec, mix_requests

from .helpers import config, disk, dram, engine, kvtier, request


def test_a_session_sends_its_next_turn_after_its_answer_and_the_pause():
    reqs = [request(0.0, 64, session="s", turn=0), request(0.0, 96, session="s", turn=1, after=2.0)]
    a, b = simulate(config(), reqs).records
    assert b.sent_s == pytest.approx(a.sent_s + a.e2e_s + 2.0)


def test_the_client_keeps_at_most_concurrency_requests_in_flight():
    reqs = [request(0.0, 128, out=8, tag=str(i)) for i in range(6)]
    records = simulate(config(concurrency=2), reqs).records
    spans = [(r.sent_s, r.sent_s + r.e2e_s) for r in records]
    for t, _ in spans:
        assert sum(1 for s, e in spans if s <= t < e) <= 2


def _mix():
    return mix_requests(MixSpec(sessions=30, rate_per_s=5.0, block_tokens=16, doc_tokens=512,
                                repo_tokens=512, system_tokens=256, output_tokens=8))  # fmt: skip


def test_replicas_share_the_shared_tier_and_the_network():
    shared = replace_shared(disk(capacity=None))
    cfg = config(engine=engine(blocks=512), kvtier=kvtier(dram(capacity=2e6), shared), replicas=2)
    result = simulate(cfg, _mix())
    s = result.summary
    assert s["finished"] + s["rejected"] == s["requests"] and s["finished"] > 100
    assert len(s["replicas"]) == 2
    assert "network" in s["links"] and "disk" in s["tiers"]  # one shared tier, not one each
    assert all(r["steps"] > 0 for r in s["replicas"])


def replace_shared(spec):
    from dataclasses import replace

    return replace(spec, shared=True)


def test_the_same_inputs_give_the_same_result_whatever_the_hash_seed():
    code = (
        "import json, sys; sys.path.insert(0, 'tests');"
        "from sim.test_simulator import _mix; from sim.helpers import config, kvtier;"
        "from kvtier.sim.simulator import simulate;"
        "r = simulate(config(kvtier=kvtier()), _mix()).to_dict(); r.pop('run');"
        "print(json.dumps(r))"
    )
    run = [sys.executable, "-c", code]
    outs = set()
    for seed in ("1", "2"):
        env = {"PYTHONHASHSEED": seed, "PATH": ""}
        outs.add(subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout)
    assert len(outs) == 1 and '"finished"' in outs.pop()


def test_an_empty_workload_is_refused():
    with pytest.raises(ConfigError):
        simulate(config(), [])


def test_a_request_the_engine_could_never_hold_is_refused_and_the_rest_go_on():
    reqs = [request(0.0, 64 * 16 + 1, tag="huge"), request(0.0, 64, tag="small")]
    result = simulate(config(), reqs)
    assert result.summary["rejected"] == 1 and result.summary["finished"] == 1
