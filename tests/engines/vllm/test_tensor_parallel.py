"""kvtier's connector in a real vLLM engine at tensor-parallel size 3 (one worker per KV head).

Two engines, one after the other, on one disk tier: ``first`` computes and stores two prompts,
then computes each again from vLLM's own prefix cache (the reference: the same cached/computed
split a load from kvtier gives); ``restart`` finds nothing in vLLM's cache and loads both from
kvtier's disk tier. A rank that failed to read its part would report its blocks as load errors,
so a load counted whole with no failed block was read by every rank. Then one writer's slab
files (one rank's parts) are corrupted: that rank's part fails, the whole chunk is recomputed
on every rank, and the tokens stay the same. ``first`` publishes vLLM's KV events: a subscriber
hears kvtier's BlockStored for every chunk once all three ranks stored their parts, and
BlockRemoved for the chunks its small host-memory tier evicted. Events go out with the engine's
steps, so ``first`` ends with a short prompt (below a chunk: it stores nothing) that makes the
engine step once after its last writes to disk landed.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from kvtier.engines.vllm.records import read_records
from kvtier.harness.vllm_probe import Probe

from .conftest import EventListener

TOKENS = 16
pytestmark = pytest.mark.timeout(1200)

#: Three worker processes on this machine's cores: one OpenMP thread each.
TP_ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@pytest.fixture(scope="module")
def tp_runs(text_tokens, tmp_path_factory):
    work = tmp_path_factory.mktemp("tp3")
    t = text_tokens
    prompts = {"P": t[0:1100], "Q": t[3000:3600]}
    disk = work / "disk"
    shm = [Path(f"/dev/shm/kvtier-tp-{uuid.uuid4().hex[:8]}-{i}") for i in range(2)]

    def spec(i: int, steps: list[dict]) -> dict:
        return {
            "connector": {
                # a rank's part of a chunk is 2 MB: the first engine's host memory holds three
                "tiers": [
                    f"slab://{shm[i]}?size={6 if i == 0 else 96}MiB",
                    f"slab://{disk}?size=512MiB",
                ],
                "records": str(work / f"records{i}.jsonl"),
            },
            "tp": 3,
            "prefix_caching": True,
            "max_model_len": 2048,
            "steps": steps,
        }

    P, Q = prompts["P"], prompts["Q"]
    once = [{"prompts": [p], "max_tokens": TOKENS} for p in (P, P, Q, Q)]
    # the disk tier's writes land behind the requests: let them, then step the engine once
    flush = [{"sleep": 3}, {"prompts": [t[5000:5040]], "max_tokens": 1}]
    steps = [
        {"prompts": [P], "max_tokens": TOKENS},
        {"corrupt_writer": f"{disk}/**/*.slab"},
        {"prompts": [Q], "max_tokens": TOKENS},
    ]
    go = work / "restart.go"
    probes: list[Probe] = []
    endpoint = f"ipc://{work}/events"
    listener = EventListener(endpoint)
    try:
        # the restart engine imports vLLM now and builds its engine once the first has exited
        first_spec = {**spec(0, [*once, *flush]), "kv_events": endpoint}
        probes.append(Probe(first_spec, work, "first", env=TP_ENV))
        probes.append(Probe({**spec(1, steps), "start_when": str(go)}, work, "restart", TP_ENV))
        first = probes[0].result(600)
        events = listener.stop()
        shutil.rmtree(shm[0], ignore_errors=True)
        go.write_text("go\n")
        restart = probes[1].result(600)
    finally:
        listener.stop()
        for p in probes:
            if p.proc.poll() is None:
                p.kill()
        for d in shm:
            shutil.rmtree(d, ignore_errors=True)
    return {
        "first": first,
        "restart": restart,
        "records": [read_records(work / f"records{i}.jsonl") for i in range(2)],
        "prompts": prompts,
        "events": events,
    }


def _record(records: list[dict], prompt: list[int]) -> dict:
    from kvtier.engines.vllm.records import prompt_hash

    (rec,) = [r for r in records if r["prompt_hash"] == prompt_hash(prompt)]
    return rec


def test_a_restarted_tp3_engine_loads_every_ranks_part_and_gives_the_same_tokens(tp_runs):
    first, restart = tp_runs["first"], tp_runs["restart"]
    assert restart[0]["tokens"] == first[1]["tokens"]  # loaded from kvtier = vLLM's own cache
    assert all(r["loaded_tokens"] == 0 for r in tp_runs["records"][0])  # the reference: no load
    rec = _record(tp_runs["records"][1], tp_runs["prompts"]["P"])
    assert rec["loaded_tokens"] == 1024 and rec["failed_blocks"] == 0
    assert rec["local_hit_tokens"] == 0


def test_one_ranks_corrupt_parts_are_recomputed_on_every_rank_with_the_same_tokens(tp_runs):
    first, restart = tp_runs["first"], tp_runs["restart"]
    rec = _record(tp_runs["records"][1], tp_runs["prompts"]["Q"])
    assert rec["failed_blocks"] > 0 and rec["loaded_tokens"] < 512
    assert restart[2]["tokens"] == first[3]["tokens"]


def test_kvtiers_stores_and_evictions_reach_a_kv_event_subscriber_once_per_chunk(tp_runs):
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    ours = [e for e in tp_runs["events"] if getattr(e, "ownership", None) in ("host", "slab")]
    on_disk = [e for e in ours if isinstance(e, BlockStored) and e.ownership == "slab"]
    P, Q = tp_runs["prompts"]["P"], tp_runs["prompts"]["Q"]
    chunks = [P[i * 256 : (i + 1) * 256] for i in range(4)] + [Q[0:256], Q[256:512]]
    # every chunk, in STORAGE, by vLLM's hashes; announced once per store though three ranks
    # stored a part each (a prompt computed twice is stored twice: at most two announcements)
    heard = [tuple(e.token_ids) for e in on_disk]
    assert set(heard) == {tuple(c) for c in chunks}
    assert all(heard.count(tuple(c)) in (1, 2) for c in chunks)
    assert all(e.medium == "STORAGE" and len(e.block_hashes) == 2 for e in on_disk)
    gpu = {
        h
        for e in tp_runs["events"]
        if isinstance(e, BlockStored) and e.medium == "GPU"
        for h in e.block_hashes
    }
    assert {h for e in on_disk for h in e.block_hashes} <= gpu  # the same names as vLLM's own
    removed = [e for e in ours if isinstance(e, BlockRemoved)]
    assert removed and all(e.medium == "CPU" and e.ownership == "host" for e in removed)
