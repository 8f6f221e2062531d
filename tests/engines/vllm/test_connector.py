"""kvtier's connector inside real vLLM engines: same greedy tokens, and the KV came from kvtier.

Engines (each its own process, shared by the tests of this module):

- ``reference``: vLLM alone with its prefix cache; it computes every prompt with the same
  cached/computed split the kvtier engines get, so their tokens must match it exactly.
- ``first``: kvtier (host-memory ``slab://`` in /dev/shm, then a disk ``slab://``), vLLM's prefix
  cache off so that every reuse must come from kvtier: reuse, an extended prompt, a partial hit.
- ``second``: another engine process, running while ``first`` is still alive, with its own host
  memory and the same disk tier; a pool of 19 blocks forces preemption.
- ``restart``: after both exited, a new engine on the same disk tier, vLLM's prefix cache on
  (kvtier supplies only what it lacks); then the disk tier's files are corrupted.
- ``files``: a ``file://`` tier whose block files are deleted, then whose directory is replaced.

An engine's start-up is mostly single-threaded, so the engines start up together and then
take turns to compute, ``reference``, ``files``, ``first``, ``second``: an engine computing
beside any other work slows down several times over (its OpenMP threads wait on each other).
``restart`` imports vLLM early and builds its engine once the others have exited. Every
engine computes in the dtype ``auto`` picks for the CPU (bf16 where native, else fp32). All but
``second`` run vLLM's engine core and worker inside the probe's process (start-up is mostly
importing vLLM, once per process); ``second`` keeps vLLM's three processes, so the connector's
plan crosses processes as it does in a server (as in test_server_metrics).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from kvtier.engines.vllm.records import read_records
from kvtier.harness.layer_check import CHECK_FILE
from kvtier.harness.vllm_probe import Probe

SHORT = 16
LONG = 100


# the module's engines all start in the first test's fixture
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def prompts(text_tokens) -> dict[str, list[int]]:
    t = text_tokens
    p = t[0:1100]
    return {
        "P": p,
        "PQ": p + t[3000:3300],
        "P2": t[0:600] + t[4000:4500],
        "D": t[5000:6100],
        "S": [p[:1024] + t[2000 + i * 150 : 2076 + i * 150] for i in range(2)],
        "W": t[6200:6712],  # exactly two 256-token chunks: a repeat finds all of it in kvtier
    }


@pytest.fixture(scope="module")
def runs(prompts, tmp_path_factory):
    """Every engine's outputs and the connector's records, run once for the module."""
    work = tmp_path_factory.mktemp("vllm")
    tag = uuid.uuid4().hex[:8]
    shm = [Path(f"/dev/shm/kvtier-test-{tag}-{i}") for i in range(3)]
    disk = work / "disk"
    files = work / "files"

    def tiers(i: int) -> list[str]:
        return [f"slab://{shm[i]}?size=192MiB", f"slab://{disk}?size=1GiB"]

    P, PQ, P2, D, S, W = (prompts[k] for k in ("P", "PQ", "P2", "D", "S", "W"))
    started: list[Probe] = []

    def probe(spec: dict, name: str) -> Probe:
        # one process per engine (one vLLM import, not three), but for "second": its scheduler
        # and worker halves talk across processes as in a server
        env = {CHECK_FILE: str(work / f"{name}.layers.jsonl")}
        started.append(Probe({**spec, "one_process": name != "second"}, work, name, env))
        return started[-1]

    try:
        ref = probe(
            {
                "steps": [
                    {"prompts": [P], "max_tokens": SHORT},
                    {"prompts": [D], "max_tokens": SHORT},
                    {"prompts": [P], "max_tokens": SHORT},
                    {"prompts": [PQ], "max_tokens": SHORT},
                    {"prompts": [P2], "max_tokens": SHORT},
                    {"prompts": S, "max_tokens": LONG},
                    {"prompts": [PQ], "max_tokens": SHORT},
                ]
            },
            "reference",
        )
        file_tier = probe(
            {
                "connector": {
                    "tiers": [f"file://{files}?size=1GiB"],
                    "records": str(work / "files.jsonl"),
                },
                "prefix_caching": False,
                "run_when": str(work / "files.turn"),
                "steps": [
                    {"prompts": [P], "max_tokens": SHORT},
                    {"prompts": [P], "max_tokens": SHORT},
                    {"delete": f"{files}/**/*.kvb"},
                    {"prompts": [P], "max_tokens": SHORT},
                    {"kill": str(files)},
                    {"prompts": [P], "max_tokens": SHORT},
                ],
            },
            "files",
        )
        first = probe(
            {
                "connector": {
                    "tiers": tiers(0),
                    "records": str(work / "first.jsonl"),
                    "layerwise": True,  # off by default on the CPU backend
                },
                # layer by layer, each attention layer's wait checked inside the forward
                "connector_module": "kvtier.harness.layer_check",
                "connector_class": "LayerCheckedConnector",
                "prefix_caching": False,
                "run_when": str(work / "first.turn"),
                "steps": [
                    {"prompts": [P], "max_tokens": SHORT},
                    {"prompts": [P], "max_tokens": SHORT},
                    {"prompts": [PQ], "max_tokens": SHORT},
                    {"prompts": [P2], "max_tokens": SHORT},
                    {"prompts": [D], "max_tokens": SHORT},
                    {"prompts": [W], "max_tokens": SHORT},
                    {"prompts": [W], "max_tokens": SHORT},
                    {"signal": str(work / "first.ready"), "wait_for": str(work / "first.go")},
                ],
            },
            "first",
        )
        # the second engine computes once the first has stored everything and is still alive
        second = probe(
            {
                "connector": {"tiers": tiers(1), "records": str(work / "second.jsonl")},
                "prefix_caching": False,
                "blocks": 19,
                "max_model_len": 2048,
                "max_num_seqs": 2,
                "run_when": str(work / "first.ready"),
                "steps": [
                    {"prompts": [P], "max_tokens": SHORT},
                    # P's prefix came from the disk; its promotion into host memory finishes
                    # before S looks it up, so both S requests load it the same way (in step)
                    # and vLLM preempts the same one of them every run
                    {"sleep": 3},
                    {"prompts": S, "max_tokens": LONG},
                ],
            },
            "second",
        )
        # the restart engine imports vLLM now and builds its engine once both others exited
        restarted = probe(
            {
                "connector": {"tiers": tiers(2), "records": str(work / "restart.jsonl")},
                "prefix_caching": True,
                "start_when": str(work / "restart.go"),
                "steps": [
                    {"prompts": [P], "max_tokens": SHORT},
                    {"prompts": [PQ], "max_tokens": SHORT},
                    {"corrupt": f"{disk}/**/*.slab"},
                    {"prompts": [D], "max_tokens": SHORT},
                ],
            },
            "restart",
        )
        reference = ref.result()
        (work / "files.turn").write_text("go\n")
        files_out = file_tier.result()
        (work / "first.turn").write_text("go\n")
        _wait_for(work / "first.ready", first)
        second_out = second.result()
        (work / "first.go").write_text("go\n")
        first_out = first.result()
        shutil.rmtree(shm[0], ignore_errors=True)
        shutil.rmtree(shm[1], ignore_errors=True)
        (work / "restart.go").write_text("go\n")
        restart = restarted.result()
    finally:
        for p in started:
            if p.proc.poll() is None:
                p.kill()
        for d in shm:
            shutil.rmtree(d, ignore_errors=True)
    records = {
        n: read_records(work / f"{n}.jsonl") for n in ("first", "second", "restart", "files")
    }
    return {
        "reference": reference,
        "first": first_out,
        "second": second_out,
        "restart": restart,
        "files": files_out,
        "records": records,
        "work": work,
    }


def _wait_for(path: Path, probe: Probe, timeout: float = 420) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        if probe.proc.poll() is not None or time.monotonic() > deadline:
            probe.kill()
            pytest.fail("the first engine never got ready:\n" + probe.log_path.read_text()[-4000:])
        time.sleep(0.5)


def _tokens(run: list[dict], step: int) -> list[list[int]]:
    return run[step]["tokens"]


def _by_prompt(records: list[dict], prompt: list[int]) -> list[dict]:
    from kvtier.engines.vllm.scheduler import prompt_hash

    h = prompt_hash(prompt)
    return [r for r in records if r["prompt_hash"] == h]


def test_reuse_in_one_engine_gives_the_same_tokens_from_kvtier_host_memory(runs, prompts):
    ref, first = runs["reference"], runs["first"]
    assert _tokens(first, 0) == _tokens(ref, 0)  # cold: computed
    assert _tokens(first, 1) == _tokens(ref, 2)  # again: loaded
    recs = _by_prompt(runs["records"]["first"], prompts["P"])
    assert [r["loaded_tokens"] for r in recs] == [0, 1024]
    assert set(recs[1]["hit_tokens"]) == {"host"}  # the first tier: host memory


def test_every_attention_layer_waits_until_its_own_loaded_blocks_hold_the_stored_bytes(runs):
    """Inside the forward (the checked connector, right after each layer's wait): the layer's
    blocks of the step's layer-by-layer loads already hold what was read for them."""
    import json

    lines = (runs["work"] / "first.layers.jsonl").read_text().splitlines()
    checks = [json.loads(line) for line in lines]
    loaded = [c for c in checks if c["blocks"]]
    assert loaded, "no layer-by-layer load was checked"
    assert {c["layer"] for c in loaded} == set(range(30))  # every layer of the model
    assert all(c["ready"] and c["matching"] == c["blocks"] for c in loaded), loaded[:3]


def test_an_extended_prompt_loads_the_shared_prefix(runs, prompts):
    assert _tokens(runs["first"], 2) == _tokens(runs["reference"], 3)
    (rec,) = _by_prompt(runs["records"]["first"], prompts["PQ"])
    assert rec["loaded_tokens"] == 1024


def test_a_partial_hit_loads_only_the_chunks_that_match(runs, prompts):
    assert _tokens(runs["first"], 3) == _tokens(runs["reference"], 4)
    (rec,) = _by_prompt(runs["records"]["first"], prompts["P2"])
    assert rec["loaded_tokens"] == 512


def test_a_prompt_kvtier_holds_whole_is_loaded_and_vllm_computes_its_last_token(runs, prompts):
    """A repeat of a prompt of whole chunks finds every token in host memory. A load inside the
    step must leave vLLM a token to compute (its scheduler asserts it), so this one loads
    asynchronously and vLLM recomputes the last token: the engine answers, it does not die."""
    first = runs["first"]
    assert len(prompts["W"]) == 512
    assert 0 < len(_tokens(first, 6)[0]) <= SHORT
    recs = _by_prompt(runs["records"]["first"], prompts["W"])
    assert [r["loaded_tokens"] for r in recs] == [0, 512]
    assert set(recs[1]["hit_tokens"]) == {"host"} and recs[1]["sync"] is False


def test_another_engine_process_loads_what_the_first_stored_on_the_shared_disk(runs, prompts):
    assert _tokens(runs["second"], 0) == _tokens(runs["reference"], 2)
    (rec,) = _by_prompt(runs["records"]["second"], prompts["P"])
    assert rec["loaded_tokens"] == 1024
    assert set(rec["hit_tokens"]) == {"slab"}  # the disk tier, written by the other process


def test_preempted_requests_reload_from_kvtier_and_give_the_same_tokens(runs, prompts):
    """The request vLLM preempted reloads its prefix from kvtier and ends with the reference's
    tokens. The other request is compared up to the preemption (its 52nd token, when the pool
    runs out): after it, it decodes alone instead of in a batch of two, and vLLM's CPU kernels
    do not give batch-invariant arithmetic, with or without kvtier."""
    ref, second = _tokens(runs["reference"], 5), _tokens(runs["second"], 2)
    by_hash = {}
    for s in prompts["S"]:
        by_hash[id(s)] = _by_prompt(runs["records"]["second"], s)
    resumed = [
        i for i, s in enumerate(prompts["S"]) if any(r["preemptions"] for r in by_hash[id(s)])
    ]
    assert resumed, f"the 19-block pool preempted nothing: {by_hash}"
    for i, s in enumerate(prompts["S"]):
        assert 0 < len(second[i]) <= LONG  # answered (an end-of-text token may end it early)
        if i in resumed:
            assert all(r["loaded_tokens"] >= 1024 for r in by_hash[id(s)])
        assert second[i] == ref[i] if i in resumed else second[i][:50] == ref[i][:50]


def test_after_a_restart_the_disk_tier_serves_what_vllms_own_cache_lacks(runs, prompts):
    ref, restart = runs["reference"], runs["restart"]
    assert _tokens(restart, 0) == _tokens(ref, 2)
    assert _tokens(restart, 1) == _tokens(ref, 6)
    recs = runs["records"]["restart"]
    (p,) = _by_prompt(recs, prompts["P"])
    assert p["loaded_tokens"] == 1024 and p["local_hit_tokens"] == 0
    (pq,) = _by_prompt(recs, prompts["PQ"])
    # vLLM's cache has P's 1024 tokens; kvtier adds the chunk the first engine stored after it
    assert pq["local_hit_tokens"] == 1024 and pq["loaded_tokens"] == 256


def test_a_corrupted_disk_block_is_recomputed_and_counted(runs, prompts):
    assert _tokens(runs["restart"], 3) == _tokens(runs["reference"], 1)
    (d,) = _by_prompt(runs["records"]["restart"], prompts["D"])
    assert d["failed_blocks"] > 0 and d["loaded_tokens"] == 0


def test_deleted_block_files_and_a_dead_tier_are_recomputed_and_counted(runs, prompts):
    ref, files = runs["reference"], runs["files"]
    assert _tokens(files, 0) == _tokens(ref, 0)
    assert _tokens(files, 1) == _tokens(ref, 2)
    assert _tokens(files, 3) == _tokens(ref, 0)  # block files deleted: recomputed
    assert _tokens(files, 5) == _tokens(ref, 0)  # the tier's directory is gone
    recs = _by_prompt(runs["records"]["files"], prompts["P"])
    assert recs[1]["loaded_tokens"] == 1024
    assert recs[2]["failed_blocks"] > 0 and recs[2]["loaded_tokens"] == 0
    assert recs[3]["failed_blocks"] > 0 and recs[3]["loaded_tokens"] == 0
