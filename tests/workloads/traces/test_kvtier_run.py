"""kvtier run reports as traces: one phase's requests, closed-loop delays, measured figures, and
the run's set-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.traces import read_trace

REPORT = Path(__file__).resolve().parents[1] / "data" / "kvtier_run_small.json"


def records(system: str) -> list[dict]:
    phases = json.loads(REPORT.read_text())["phases"]
    return next(p for p in phases if p["system"] == system)["requests"]


def test_first_phase_by_default_with_due_times_and_chunk_blocks():
    trace = read_trace(REPORT, "kvtier-run")
    assert trace.run is not None and trace.run.system == "vllm" and trace.skipped == 0
    raw = records("vllm")
    assert [r.arrival_s for r in trace.requests] == [d["due_s"] for d in raw]
    assert [(r.session, r.turn, r.kind) for r in trace.requests] == [
        (d["session"], d["turn"], d["kind"]) for d in raw
    ]
    for r, d in zip(trace.requests, raw, strict=True):
        assert r.block_tokens == 256 and r.input_tokens == d["prompt_tokens"]
        assert r.blocks[: len(d["block_hashes"])] == tuple(
            bytes.fromhex(k) for k in d["block_hashes"]
        )
        assert len(r.blocks) == -(-r.input_tokens // 256)  # plus the partial last block
        assert r.measured["ttft_s"] == d["ttft_s"] and r.measured["sent_s"] == d["sent_s"]
        assert r.measured["hit_tokens"] == d["hit_tokens"]


def test_equal_prefixes_equal_keys_different_prompts_different_tails():
    r = {(x.session, x.turn): x for x in read_trace(REPORT, "kvtier-run").requests}
    a, b = r["code-0.0.repo0", 0], r["code-0.1.repo0", 0]
    assert a.input_tokens == b.input_tokens == 4506
    # The system prompt and repository fill 16 chunks; the 17th holds the edit too.
    assert a.blocks[:16] == b.blocks[:16] and a.blocks[16] != b.blocks[16]
    assert a.blocks[-1] != b.blocks[-1]  # different edits: different partial tails
    assert r["chat-0", 1].blocks[:4] == r["rag-0.doc0", 0].blocks[:4]  # the system prompt


def test_after_s_is_the_delay_after_the_previous_turn_ended():
    raw = {(d["session"], d["turn"]): d for d in records("vllm")}
    r = {(x.session, x.turn): x for x in read_trace(REPORT, "kvtier-run").requests}
    assert r["chat-0", 0].after_s is None and r["rag-0.doc0", 0].after_s is None
    for turn in (1, 2):
        prev = raw["chat-0", turn - 1]
        want = raw["chat-0", turn]["due_s"] - (prev["sent_s"] + prev["e2e_s"])
        assert r["chat-0", turn].after_s == pytest.approx(max(0.0, want))
        assert r["chat-0", turn].after_s == pytest.approx(1.0, abs=0.01)  # the think time


def test_run_meta_of_each_phase():
    vllm = read_trace(REPORT, "kvtier-run").run
    tiered = read_trace(REPORT, "kvtier-run", system="vllm+kvtier").run
    assert vllm is not None and tiered is not None
    assert (vllm.concurrency, vllm.pool_blocks, vllm.max_model_len, vllm.chunk_tokens) == (
        4,
        72,
        8192,
        256,
    )
    assert set(vllm.engine) == {"a_s", "b_s_per_token", "c_s_per_token2", "decode_step_s"}
    assert vllm.engine["decode_step_s"] > 0 and vllm.kv_bytes_per_token == 23040
    assert vllm.tiers == () and [name for name, _ in tiered.tiers] == ["dram", "disk"]
    assert all(size > 0 for _, size in tiered.tiers)
    assert vllm.metrics["vllm:prefix_cache_hits_total"] != tiered.metrics.get(
        "vllm:prefix_cache_hits_total"
    )


def test_bad_records_phases_and_block_sizes(tmp_path):
    report = json.loads(REPORT.read_text())
    report["phases"][0]["requests"][2]["prompt_tokens"] = -3
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ConfigError, match=r"phase 'vllm', request 2: field 'prompt_tokens'"):
        read_trace(path, "kvtier-run")
    trace = read_trace(path, "kvtier-run", skip_bad=True)
    assert (len(trace.requests), trace.skipped) == (5, 1)
    with pytest.raises(ConfigError, match="no phase 'sglang' in the run; it has vllm, vllm"):
        read_trace(REPORT, "kvtier-run", system="sglang")
    with pytest.raises(ConfigError, match="256-token blocks; block_tokens 512"):
        read_trace(REPORT, "kvtier-run", block_tokens=512)
    path.write_text('{"phases": [\n  {"system": "vllm",,}\n]}')
    with pytest.raises(ConfigError, match=r"run.json:2: not a JSON run report"):
        read_trace(path, "kvtier-run")
