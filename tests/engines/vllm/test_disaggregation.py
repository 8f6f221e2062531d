"""Prefill/decode disaggregation through shared tiers, real vLLM engines each in its own process.

A producer (``kv_role: kv_producer``) prefills a prompt (one token), storing its KV through its
host-memory tier into Valkey/Redis, S3 and a Mooncake Store, and answers how many chunks it
stored in the response's ``kv_transfer_params``; then it computes the prompt again from vLLM's own
prefix cache (the reference: the split a consumer loads at). Three consumers (``kv_consumer``),
started beside it, each with another PYTHONHASHSEED and one of the shared tiers, are handed those
``kv_transfer_params`` as a proxy would, wait until the chunks are visible, load them instead of
recomputing, and generate the producer's greedy tokens. A consumer never stores: a prompt it
computes twice is computed twice.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from kvtier.engines.vllm.records import prompt_hash, read_records
from kvtier.harness.vllm_probe import Probe

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(1500)]

SHORT = 16
CHUNK = 256


@pytest.fixture(scope="module")
def fleet(redis_server, s3_server, mooncake_server, text_tokens, tmp_path_factory):
    work = tmp_path_factory.mktemp("pd")
    tag = uuid.uuid4().hex[:8]
    P, D = text_tokens[0:1100], text_tokens[5000:5600]
    shm = [Path(f"/dev/shm/kvtier-pd-{tag}-{i}") for i in range(2)]
    # four engines start at once on a small machine: a write may wait seconds for a core, and
    # one that outlasts its tier's timeout is dropped (a miss, as designed), not what this tests
    wait = "timeout=30"
    redis = f"{redis_server.url}?prefix=pd-{tag}&{wait}&name=redis"
    s3 = f"s3://kvtier-tests/pd-{tag}?endpoint={s3_server.endpoint}&create=1&name=s3&{wait}"
    mooncake = f"{mooncake_server.url}&prefix=pd-{tag}&{wait}&name=mooncake"
    ready = work / "prefilled"
    handed = {"kvtier_chunks": len(P) // CHUNK}  # what the proxy passes on (checked below)

    def engine(name: str, role: str, tiers: list[str], steps: list[dict], seed: int) -> Probe:
        spec = {
            "connector": {
                "tiers": tiers,
                "records": str(work / f"{name}.jsonl"),
                "producer_wait_s": 60,
            },
            "kv_role": role,
            "prefix_caching": role == "kv_producer",
            "one_process": True,
            "steps": steps,
        }
        if role == "kv_consumer":
            spec["run_when"] = str(ready)
        env = {**s3_server.env, "PYTHONHASHSEED": str(seed)}
        return Probe(spec, work, name, env=env)

    decode = {"prompts": [P], "max_tokens": SHORT, "kv_transfer_params": handed}
    probes: list[Probe] = []
    try:
        probes = [
            engine(
                "producer",
                "kv_producer",
                [f"slab://{shm[0]}?size=96MiB", redis, s3, mooncake],
                [
                    {"prompts": [P], "max_tokens": 1},
                    {"signal": str(ready)},
                    {"prompts": [P], "max_tokens": SHORT},
                ],
                1,
            ),
            engine(
                "via_redis",
                "kv_consumer",
                [f"slab://{shm[1]}?size=96MiB", redis],
                [decode, {"prompts": [D], "max_tokens": SHORT}, {"prompts": [D], "max_tokens": 1}],
                2,
            ),
            engine("via_s3", "kv_consumer", [s3], [decode], 3),
            engine("via_mooncake", "kv_consumer", [mooncake], [decode], 4),
        ]
        outs = {p.out_path.stem.removesuffix(".out"): p.result(900) for p in probes}
    finally:
        for p in probes:
            if p.proc.poll() is None:
                p.kill()
        for d in shm:
            shutil.rmtree(d, ignore_errors=True)
    records = {n: read_records(work / f"{n}.jsonl") for n in outs}
    return {"outs": outs, "records": records, "handed": handed, "P": P, "D": D, "work": work}


def _kvtier_lines(log: Path) -> list[str]:
    """kvtier's warnings and errors in an engine's log, and Mooncake's (glog's ``E``/``W``
    lines): what a failed load said."""
    if not log.exists():
        return []
    lines = log.read_text(errors="replace").splitlines()
    return [
        line[:300]
        for line in lines
        if ("kvtier" in line and ("WARN" in line or "ERR" in line)) or re.match(r"[EW]\d{4} ", line)
    ]


def _one(records: list[dict], prompt: list[int]) -> list[dict]:
    return [r for r in records if r["prompt_hash"] == prompt_hash(prompt)]


def test_the_producer_computes_stores_and_says_how_many_chunks(fleet):
    prefill = fleet["outs"]["producer"][0]
    assert prefill["kv_transfer_params"] == [fleet["handed"]]
    assert all(r["loaded_tokens"] == 0 for r in fleet["records"]["producer"])  # never loads


@pytest.mark.parametrize(
    "consumer, tier", [("via_redis", "redis"), ("via_s3", "s3"), ("via_mooncake", "mooncake")]
)
def test_a_consumer_loads_the_prefilled_prompt_and_gives_a_single_engines_tokens(
    fleet, consumer, tier
):
    (rec,) = _one(fleet["records"][consumer], fleet["P"])
    (stored,) = _one(fleet["records"]["producer"], fleet["P"])[:1]
    logs = {n: _kvtier_lines(fleet["work"] / f"{n}.log")[-12:] for n in (consumer, "producer")}
    seen = f"consumer's record {rec}; producer's first {stored}; kvtier's warnings {logs}"
    assert rec["loaded_tokens"] == 1024 and set(rec["hit_tokens"]) == {tier}, seen
    computed = rec["prompt_tokens"] - rec["loaded_tokens"] - rec["local_hit_tokens"]
    assert computed <= CHUNK
    assert fleet["outs"][consumer][0]["tokens"] == fleet["outs"]["producer"][2]["tokens"]


def test_a_consumer_never_stores(fleet):
    twice = _one(fleet["records"]["via_redis"], fleet["D"])
    assert len(twice) == 2 and all(r["loaded_tokens"] == 0 for r in twice)
