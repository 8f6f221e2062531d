"""Token-free generated workloads: counts and kinds as asked, blocks shared exactly where a real
prompt would share them, unique prompts sharing nothing, and the same output for a seed in any
process (PYTHONHASHSEED included)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import kvtier
from kvtier.errors import ConfigError
from kvtier.workloads.arrivals import poisson
from kvtier.workloads.synthetic import MixSpec, mix_requests, unique_prompts

SMALL = MixSpec(sessions=400, rate_per_s=2.0, block_tokens=64, docs=5, repos=2)


def test_unique_prompts_share_no_block_and_keep_their_lengths():
    arrivals = poisson(3.0, 300, seed=2)
    requests = unique_prompts(arrivals, (100, 900), 7, block_tokens=64, seed=1)
    assert [r.arrival_s for r in requests] == arrivals.tolist()
    assert all(100 <= r.input_tokens <= 900 and r.output_tokens == 7 for r in requests)
    assert all(len(r.blocks) == -(-r.input_tokens // 64) for r in requests)
    blocks = [b for r in requests for b in r.blocks]
    assert len(set(blocks)) == len(blocks)
    with pytest.raises(ConfigError, match="low <= high"):
        unique_prompts(arrivals, (900, 100), 7)


def test_mix_has_the_kinds_sessions_and_arrival_rate_asked_for():
    requests = mix_requests(SMALL)
    assert {r.kind for r in requests} == {"chat", "rag", "agent", "code"}
    starts: dict[str, float] = {}  # session index -> its first arrival
    for r in requests:
        index = r.session.split("-")[1].split(".")[0]
        starts[index] = min(starts.get(index, r.arrival_s), r.arrival_s)
    assert len(starts) == SMALL.sessions
    times = sorted(starts.values())
    assert times[0] == 0.0
    assert (len(times) - 1) / times[-1] == pytest.approx(SMALL.rate_per_s, rel=0.15)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    bursts = Counter(r.session.split(".")[0] for r in requests if r.kind == "code")
    assert set(bursts.values()) == {SMALL.burst_requests}
    only_chat = mix_requests(replace(SMALL, weights=(1, 0, 0, 0), sessions=20))
    assert {r.kind for r in only_chat} == {"chat"}


def test_each_turn_extends_the_full_blocks_of_the_previous_prompt_and_answer():
    bt = SMALL.block_tokens
    turns: dict[str, list] = {}
    for r in mix_requests(SMALL):
        turns.setdefault(r.session, []).append(r)
    grown = 0
    for session in turns.values():
        session.sort(key=lambda r: r.turn)
        for prev, cur in itertools.pairwise(session):
            assert cur.input_tokens > prev.input_tokens + prev.output_tokens
            full = prev.input_tokens // bt
            assert cur.blocks[:full] == prev.blocks[:full]
            assert cur.blocks[full] not in prev.blocks  # the old partial tail holds new tokens
            assert cur.after_s is not None and cur.after_s >= 0
            grown += 1
    assert grown > 100


def test_shared_system_prompt_documents_and_repositories():
    bt = SMALL.block_tokens
    requests = mix_requests(SMALL)
    system = SMALL.system_tokens // bt
    assert len({r.blocks[:system] for r in requests}) == 1
    for kind, length in (("rag", SMALL.doc_tokens), ("code", SMALL.repo_tokens)):
        by_context: dict[str, list] = {}
        for r in requests:
            if r.kind == kind:
                by_context.setdefault(r.session.rsplit(".", 1)[1], []).append(r)
        assert len(by_context) > 1
        shared = (SMALL.system_tokens + length) // bt
        heads = {name: {r.blocks[:shared] for r in rs} for name, rs in by_context.items()}
        assert all(len(h) == 1 for h in heads.values())  # one context, one set of keys
        assert len({next(iter(h)) for h in heads.values()}) == len(heads)
        tails = [r.blocks[-1] for rs in by_context.values() for r in rs]
        assert len(set(tails)) == len(tails)  # every question / edit is its own


def test_seeded_and_validated():
    a, b = mix_requests(SMALL), mix_requests(SMALL)
    assert a == b
    assert mix_requests(replace(SMALL, seed=1)) != a
    with pytest.raises(ConfigError, match="docs"):
        MixSpec(docs=0)
    with pytest.raises(ConfigError, match="negative"):
        MixSpec(think_s=-1.0)
    assert MixSpec(docs=0, weights=(1, 0, 1, 1)).docs == 0


DIGEST = """
import hashlib
from kvtier.workloads.arrivals import bursty
from kvtier.workloads.longctx import LongContextSpec, scaled
from kvtier.workloads.longctx_trace import longctx_requests
from kvtier.workloads.synthetic import MixSpec, mix_requests, unique_prompts
h = hashlib.sha256(bursty(2.0, 50, 3).tobytes())
reqs = mix_requests(MixSpec(sessions=60, block_tokens=128, docs=3, repos=2))
reqs += unique_prompts([0.0, 1.0], (10, 500), 3, seed=4)
reqs += longctx_requests(scaled(LongContextSpec(), 0.0))
for r in reqs:
    h.update(repr((r.arrival_s, r.input_tokens, r.output_tokens, r.session, r.turn, r.kind,
                   r.after_s)).encode() + b"".join(r.blocks))
print(h.hexdigest())
"""


def test_same_output_whatever_the_pythonhashseed():
    src = str(Path(kvtier.__file__).resolve().parents[1])
    digests = []
    for hashseed in ("1", "2"):
        path = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": path}
        run = subprocess.run(
            [sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, check=True
        )
        digests.append(run.stdout.strip())
    assert digests[0] == digests[1] and len(digests[0]) == 64
