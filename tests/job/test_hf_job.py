"""`kvtier run` on a tiny workload through the real (fp32) model: correctness, hits, report.

Not timing targets: those are `kvtier bench ttft`'s. fp32 keeps the tests fast; with it a split
prefill and a one-shot prefill pick the same greedy tokens.
"""

from __future__ import annotations

import json

import pytest

from kvtier.job.hf_job import RunConfig, run_job
from kvtier.workloads.sessions import WorkloadSpec

CHUNK = 32

TINY = WorkloadSpec(
    system_tokens=128,
    chat_sessions=1,
    chat_turns=2,
    turn_tokens=24,
    docs=1,
    doc_tokens=64,
    rag_requests=2,
    question_tokens=80,  # two chunks past the shared document: unique to the question
    agent_sessions=1,
    agent_steps=2,
    tool_result_tokens=32,
    tool_pause_s=0.05,
    max_new_tokens=4,
)


@pytest.fixture(scope="module")
def report(embedded_fp32_tok, tiny_profile, tmp_path_factory):
    config = RunConfig(
        dtype="fp32",
        chunk_tokens=CHUNK,
        dram_size="64MiB",
        disk_dir=tmp_path_factory.mktemp("run") / "disk",
        disk_size="512MiB",
        workload=TINY,
        profile_path=tiny_profile,
        check_break_even=True,
    )
    steps = []
    got = run_job(config, loaded=embedded_fp32_tok, progress=lambda *a: steps.append(a))
    got.progress_steps = steps
    return got


@pytest.mark.slow
def test_kvtier_and_recompute_generate_the_same_tokens(report):
    assert report.requests and all(r.tokens_match for r in report.requests)
    assert report.summary()["tokens_identical"] is True
    assert all(r.generated == TINY.max_new_tokens for r in report.requests)


@pytest.mark.slow
def test_second_chat_turn_reuses_the_first(report):
    chat = [r for r in report.requests if r.session == "chat-0"]
    first, second = chat
    assert first.index == 0 and first.kvtier["hit_chunks"] == 0  # the very first is cold
    stored_by_first = first.prompt_tokens // CHUNK
    assert second.kvtier["hit_chunks"] >= stored_by_first  # the lookup finds turn 1's chunks
    # what it then loads is the decision's call (load pays on this machine unless the quick
    # profile was measured under heavy load): whatever it loaded came from DRAM
    assert second.kvtier["reused_tokens"] == second.decision.load_chunks * CHUNK
    assert second.kvtier["per_tier"].get("dram", 0) == second.kvtier["loaded_chunks"]
    assert second.recompute["reused_tokens"] == 0  # the baseline never reuses
    # every request after the first shares at least the system prompt's full chunks
    system_chunks = min(r.shared_tokens for r in report.requests) // CHUNK
    assert all(r.kvtier["hit_chunks"] >= min(system_chunks, 1) for r in report.requests[1:])


@pytest.mark.slow
def test_rag_question_tail_is_kept_off_the_disk_tier(report):
    s = report.summary()
    refused = report.admission["disk"]["refused"]
    assert refused.get("rag", 0) >= 1  # the question's own chunks: no reuse expected
    assert "shared" not in refused and "chat" not in refused
    assert s["tiers"]["disk"]["not_admitted"] == sum(refused.values())
    # DRAM (no admission) took more than the disk tier
    assert s["tiers"]["dram"]["bytes_written"] > s["tiers"]["disk"]["bytes_written"]


@pytest.mark.slow
def test_summary_counts_add_up(report):
    s = report.summary()
    counts = s["decisions"]["counts"]
    assert sum(counts.values()) == s["requests"] == len(report.requests)
    assert counts["miss"] >= 1  # the first request finds nothing
    tiers = s["tiers"]
    assert s["tokens"]["hit_tokens"] == sum(t["hit_tokens"] for t in tiers.values())
    loaded = sum(r.kvtier["loaded_chunks"] for r in report.requests)
    assert loaded == sum(t["loaded_chunks"] for t in tiers.values())
    assert s["tokens"]["reused"] == loaded * CHUNK
    assert s["tokens"]["prompt"] == s["tokens"]["reused"] + s["tokens"]["computed"]
    saved = sum(r.saved_s for r in report.requests)
    assert s["ttft"]["seconds_saved"] == pytest.approx(saved)
    judged = [r.decision for r in report.requests if r.decision.faster is not None]
    assert s["decisions"]["measured"] == len(judged)
    assert all(
        r.decision.action in ("load", "partial")
        for r in report.requests
        if r.decision.faster is not None
    )


@pytest.mark.slow
def test_decision_log_has_predicted_and_actual(report):
    doc = json.loads(report.to_json())
    assert doc["schema"] == "kvtier.run/1"
    for req in doc["requests"]:
        d = req["decision"]
        for key in (
            "action",
            "predicted_load_s",
            "predicted_prefill_s",
            "predicted_s",
            "actual_load_s",
            "actual_prefill_s",
            "actual_s",
            "error",
            "queued_s",
            "faster",
        ):
            assert key in d
        assert d["actual_s"] > 0 and d["predicted_s"] > 0
        assert d["actual_prefill_s"] == req["kvtier"]["prefill_s"]
    loaded = [r for r in doc["requests"] if r["decision"]["action"] == "load"]
    assert loaded and all(r["decision"]["predicted_load_s"] > 0 for r in loaded)


@pytest.mark.slow
def test_break_even_is_reported_and_checked(report):
    for name in ("dram", "disk"):
        entry = report.break_even[name]
        assert entry["tokens"] is None or entry["tokens"] >= 1
        for check in entry["checks"]:
            assert check["tokens"] % CHUNK == 0
            assert check["reload_s"] > 0 and check["recompute_s"] > 0


@pytest.mark.slow
def test_progress_reaches_the_end_and_disk_dir_is_cleaned(report):
    done, total = report.progress_steps[-1][1:]
    assert done == total
    from pathlib import Path

    disk = Path(report.config["disk_dir"])
    assert not disk.exists() or not any(disk.iterdir())


CHAT = WorkloadSpec(
    system_tokens=96,
    chat_sessions=1,
    chat_turns=3,
    turn_tokens=40,
    docs=0,
    rag_requests=0,
    agent_sessions=0,
    max_new_tokens=3,
)


@pytest.mark.slow
def test_exact_run_has_bit_identical_logits_and_valued_blocks(
    embedded_fp32_tok, tiny_profile, tmp_path
):
    from kvtier.engines.hf import model_namespace
    from kvtier.tiers.registry import open_tier

    disk = tmp_path / "disk"
    config = RunConfig(
        dtype="fp32",
        chunk_tokens=CHUNK,
        dram_size="64MiB",
        disk_dir=disk,
        disk_size="512MiB",
        workload=CHAT,
        profile_path=tiny_profile,
        check_break_even=False,
        exact=True,
        keep_disk=True,
        pauses=False,
    )
    got = run_job(config, loaded=embedded_fp32_tok)
    s = got.summary()
    assert got.config["exact"] is True and s["tokens_identical"] is True
    assert s["logits_max_diff"] == 0.0
    assert any(r.kvtier["loaded_chunks"] for r in got.requests)  # reuse did happen

    loaded = embedded_fp32_tok
    ns = model_namespace(loaded.model, loaded.model_id, loaded.fingerprint)
    url = next(u for u, name in config.tier_urls() if name == "disk")
    tier = open_tier(url, ns.id)
    try:
        out = bytearray(loaded.model.config.num_hidden_layers * 2 * 3 * 64 * 4 * CHUNK)
        values = [tier.get_into(key, out).meta.value for key in tier.iter_keys()]
    finally:
        tier.close()
    # each stored chunk carries the seconds its reuse is expected to save (chat history: > 0)
    assert values and all(v > 0 for v in values)
