"""The vLLM job's report on made-up phases: figures derived from the records, the JSON's shape,
the table, the plots; the connector's records joined by prompt hash."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from kvtier.job.vllm_job import attach_connector_records, read_connector_records
from kvtier.job.vllm_plot import write_plots
from kvtier.job.vllm_report import (
    PhaseResult,
    RequestRecord,
    VllmRunReport,
    percentile,
    render,
    summarize_phase,
)

B, C = 1e-3, 1e-8  # the made-up engine: 1 ms per prompt token, plus a little attention


def record(session: str, turn: int, prompt: int, ttft: float, hits: dict[str, int], **kw):
    return RequestRecord(
        session=session,
        kind=session.split("-")[0],
        turn=turn,
        due_s=kw.get("sent", 0.0),
        sent_s=kw.get("sent", 0.0),
        prompt_tokens=prompt,
        prompt_hash=kw.get("hash", f"{session}.{turn}"),
        block_hashes=["00" * 16] * (prompt // 256),
        max_tokens=16,
        output_tokens=16,
        output_hash=kw.get("out", "same"),
        ttft_s=ttft,
        e2e_s=ttft + 1.0,
        cached_tokens=sum(hits.values()),
        hit_tokens=hits,
        load_wait_s=kw.get("wait"),
    )


def phases() -> list[PhaseResult]:
    alone = PhaseResult(
        system="vllm",
        startup_s=30.0,
        warmup={},
        wall_s=20.0,
        requests=[
            record("chat-0", 0, 2304, 2.0, {"vllm": 0}, wait=0.0),
            record("chat-0", 1, 2576, 2.2, {"vllm": 1024}, wait=0.0),
            record("rag-0", 0, 4224, 4.0, {"vllm": 1024}, wait=0.0),
            record("code-0", 0, 5312, 5.0, {"vllm": 0}, wait=0.0, out="other"),
        ],
        metrics={
            "vllm:request_prefill_time_seconds_sum": 12.5,
            "vllm:prefix_cache_hits_total": 2048,
        },
    )
    kv = PhaseResult(
        system="vllm+kvtier",
        startup_s=31.0,
        warmup={},
        wall_s=10.0,
        requests=[
            record("chat-0", 0, 2304, 2.0, {"vllm": 0, "dram": 0, "disk": 0}, wait=0.0),
            record("chat-0", 1, 2576, 0.5, {"vllm": 1024, "dram": 1280, "disk": 0}, wait=0.05),
            record("rag-0", 0, 4224, 0.8, {"vllm": 1024, "dram": 1024, "disk": 2048}, wait=0.2),
            record("code-0", 0, 5312, 1.0, {"vllm": 0, "dram": 0, "disk": 5120}, wait=0.3),
        ],
        metrics={"vllm:request_prefill_time_seconds_sum": 4.0},
    )
    return [alone, kv]


def report() -> VllmRunReport:
    return VllmRunReport(
        machine={"cpu": "Test CPU (avx2)", "cpus": 2},
        model={"model_id": "tiny", "dtype": "bfloat16"},
        config={"pool_blocks": 72, "concurrency": 4},
        engine={
            "prefill": {"a_s": 0.3, "b_s_per_token": B, "c_s_per_token2": C},
            "decode_step_s": 0.08,
            "prefill_tokens_per_s": 900.0,
            "prefill_reference_tokens": 4096,
        },
        sizing={"requests": 4, "prompt_tokens": 14416, "working_set_tokens": 12000, "scale": 1},
        phases=phases(),
        tiers={"tiers": [{"name": "dram", "size": "300MiB"}, {"name": "disk", "size": "1GiB"}]},
        wall_s=140.0,
    )


def test_percentiles_interpolate():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(i) for i in range(101)], 95) == pytest.approx(95.0)


def test_the_figures_come_from_the_records():
    s = report().summary()
    alone, kv = s["systems"]["vllm"], s["systems"]["vllm+kvtier"]
    assert alone["requests"] == kv["requests"] == 4
    assert alone["ttft_p50_s"] == pytest.approx((2.2 + 4.0) / 2)
    assert kv["ttft_p50_s"] == pytest.approx((0.8 + 1.0) / 2)
    assert alone["ttft_p95_s"] == pytest.approx(4.0 + 0.85 * 1.0)
    assert kv["hit_tokens"] == {"vllm": 2048, "dram": 2304, "disk": 7168}
    prompt = 2304 + 2576 + 4224 + 5312
    assert kv["prompt_tokens"] == alone["prompt_tokens"] == prompt
    assert kv["computed_tokens"] == prompt - 2048 - 2304 - 7168
    assert alone["computed_tokens"] == prompt - 2048
    # saved: the engine curve on each request's hits, not on their sum
    hits = [0, 2304, 4096, 5120]
    assert kv["prefill_saved_s"] == pytest.approx(sum(B * h + C * h * h for h in hits))
    assert kv["load_wait_s"] == pytest.approx(0.55) and alone["load_wait_s"] == 0.0
    assert kv["output_tokens_per_s"] == pytest.approx(64 / 10.0)
    assert alone["requests_per_s"] == pytest.approx(4 / 20.0)
    assert alone["engine_prefill_s"] == 12.5 and alone["engine_prefix_hits"] == 2048
    cmp = s["compare"]
    assert cmp["ttft_p50_ratio"] == pytest.approx(3.1 / 0.9)
    assert cmp["answers"] == {"compared": 4, "same": 3}


def test_the_json_holds_every_request_and_the_summary():
    r = report()
    doc = json.loads(r.to_json())
    assert doc["schema"] == "kvtier.run.vllm/1"
    assert [p["system"] for p in doc["phases"]] == ["vllm", "vllm+kvtier"]
    assert len(doc["phases"][1]["requests"]) == 4
    req = doc["phases"][1]["requests"][2]
    for key in ("prompt_hash", "block_hashes", "ttft_s", "e2e_s", "hit_tokens", "load_wait_s"):
        assert key in req
    assert doc["summary"]["systems"]["vllm+kvtier"]["hit_tokens"]["disk"] == 7168
    assert doc["engine"]["prefill"]["b_s_per_token"] == B
    assert set(doc) >= {"machine", "model", "engine", "sizing", "tiers", "config", "failed"}


def test_the_table_shows_both_systems_and_every_tier():
    console = Console(record=True, width=160)
    render(report(), console)
    text = console.export_text()
    assert "vllm+kvtier" in text and "hit tokens: kvtier disk" in text
    assert "hit tokens: vLLM pool" in text and "7168" in text
    assert "3.10 s" in text  # vLLM alone's TTFT p50
    assert "same answers on 3/4" in text


def test_a_vllm_only_report_has_no_comparison():
    r = report()
    r.phases = r.phases[:1]
    assert "compare" not in r.summary()
    console = Console(record=True, width=160)
    render(r, console)
    assert "vllm+kvtier" not in console.export_text()


def test_plots_are_written(tmp_path):
    paths = write_plots(report(), tmp_path / "plots")
    assert [p.name for p in paths] == [
        "run-vllm-ttft.png",
        "run-vllm-sources.png",
        "run-vllm-timeline.png",
    ]
    assert all(p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_connector_records_join_by_prompt_hash(tmp_path):
    kv = phases()[1]
    for r in kv.requests:
        r.hit_tokens, r.load_wait_s = {"vllm": r.cached_tokens or 0}, None
    path = tmp_path / "records.jsonl"
    lines = [
        {"prompt_hash": "chat-0.1", "local_hit_tokens": 1024, "hit_tokens": {"dram": 1280}},
        {"prompt_hash": "rag-0.0", "local_hit_tokens": 0, "hit_tokens": {"disk": 512}},
        {"prompt_hash": "warmup", "local_hit_tokens": 0, "hit_tokens": {}},
    ]
    lines[1]["loaded_tokens"] = 256  # the second of its two chunks failed to load
    lines[0]["load_wait_s"] = 0.05
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n{broken\n")
    read = read_connector_records(path)
    assert len(read) == 3
    notes = attach_connector_records(kv.requests, read)
    chat = kv.requests[1]
    assert chat.hit_tokens == {"vllm": 1024, "dram": 1280} and chat.load_wait_s == 0.05
    assert chat.connector is not None and chat.connector["prompt_hash"] == "chat-0.1"
    rag = kv.requests[2]
    assert rag.hit_tokens == {"vllm": 0, "disk": 512} and rag.load_wait_s == 0.0
    assert rag.unloaded_tokens == 256 and rag.hits == 256 and chat.unloaded_tokens == 0
    s = summarize_phase(kv, lambda n: 0.0)
    assert s["unloaded_tokens"] == 256
    assert s["computed_tokens"] == s["prompt_tokens"] - sum(r.hits for r in kv.requests)
    assert s["hit_tokens"]["disk"] == 512  # what each tier was asked for stays as it was
    assert "2 of 4 requests have no connector record" in notes[0]
    assert "differ" in notes[1]  # rag: vLLM said 4096 cached, the record 512
    assert read_connector_records(tmp_path / "missing.jsonl") == []


def test_summarize_phase_without_records_of_kvtier_waits():
    kv = phases()[1]
    for r in kv.requests:
        r.load_wait_s = None
    assert summarize_phase(kv, lambda n: 0.0)["load_wait_s"] is None


def test_a_codec_phase_reports_the_tokens_each_disk_held_and_what_they_bought():
    r = report()
    raw = r.phases[1]
    raw.tiers = {
        "held": {
            "dram": {"blocks": 4, "tokens": 1024, "stored_bytes": 4 << 20, "capacity_bytes": 0},
            "disk": {"blocks": 8, "tokens": 2048, "stored_bytes": 8 << 20, "capacity_bytes": 0},
        }
    }
    coded = PhaseResult(
        system="vllm+kvtier+codec",
        startup_s=31.0,
        warmup={},
        wall_s=9.0,
        requests=[
            record("chat-0", 0, 2304, 2.0, {"vllm": 0, "dram": 0, "disk": 0}),
            record("chat-0", 1, 2576, 0.5, {"vllm": 1024, "dram": 1280, "disk": 0}),
            record("rag-0", 0, 4224, 0.6, {"vllm": 1024, "dram": 1024, "disk": 2176}),
            record("code-0", 0, 5312, 0.9, {"vllm": 0, "dram": 0, "disk": 5312}),
        ],
        tiers={
            "held": {
                "disk": {"blocks": 12, "tokens": 3072, "stored_bytes": 8 << 20, "capacity_bytes": 0}
            }
        },
    )
    r.phases.append(coded)
    s = r.summary()
    assert s["systems"]["vllm+kvtier+codec"]["held_tokens"] == {"disk": 3072}
    codec = s["codec"]
    assert codec["disk_tokens_held"] == {"raw": 2048, "kv": 3072}
    assert codec["disk_tokens_held_ratio"] == pytest.approx(1.5)
    assert codec["disk_hit_tokens"] == {"raw": 7168, "kv": 7488}
    assert codec["hit_fraction"]["kv"] > codec["hit_fraction"]["raw"]
    assert codec["ttft_p50_ratio"] == pytest.approx(0.9 / 0.75)  # p50s: 0.9 s raw, 0.75 s coded
    assert "compare" in s  # vLLM alone vs the first kvtier phase, as before
    console = Console(record=True, width=200)
    render(r, console)
    text = console.export_text()
    assert "vllm+kvtier+codec" in text and "tokens held at the end: disk" in text
    assert "3072 (8 MiB)" in text and "tokens held 1.50× (3072 vs 2048)" in text
    json.loads(r.to_json())
