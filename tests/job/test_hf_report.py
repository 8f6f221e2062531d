"""The HF job's report and plots on made-up requests: the figures add up, the JSON's shape, the
table, the plots' files."""

from __future__ import annotations

import json

from rich.console import Console

from kvtier.job.decision import DecisionEntry
from kvtier.job.hf_plot import write_plots
from kvtier.job.hf_report import SCHEMA, RequestResult, RunReport, render

#: (action, predicted load, predicted prefill, actual load, actual prefill, faster) per request.
DECISIONS = [
    ("miss", 0.0, 0.3, 0.0, 0.31, None),
    ("load", 0.01, 0.02, 0.012, 0.03, True),
    ("partial", 0.02, 0.05, 0.03, 0.04, False),
    ("recompute", 0.0, 0.2, 0.0, 0.25, None),
]


def request(i: int) -> RequestResult:
    action, p_load, p_prefill, a_load, a_prefill, faster = DECISIONS[i]
    entry = DecisionEntry(
        action=action,
        hit_chunks=2,
        usable_chunks=2,
        load_chunks=0 if action == "miss" else 2,
        tiers=("dram",),
        queued_s={},
        predicted_load_s=p_load,
        predicted_prefill_s=p_prefill,
        predicted_recompute_s=0.4,
        actual_load_s=a_load,
        actual_prefill_s=a_prefill,
        alternative_s=None if faster is None else 0.5,
        faster=faster,
    )
    return RequestResult(
        index=i,
        session=f"chat-{i % 2}",
        kind="chat",
        turn=i // 2,
        prompt_tokens=300 + 50 * i,
        shared_tokens=128,
        tokens_match=i != 2,
        generated=8,
        kvtier={
            "ttft_s": 0.05 + 0.1 * i,
            "reused_tokens": 64 * i,
            "per_tier": {"dram": i, "disk": i // 2} if i else {},
        },
        recompute={"ttft_s": 0.4 + 0.05 * i},
        decision=entry,
    )


def report() -> RunReport:
    return RunReport(
        config={"exact": False},
        model={
            "model_id": "tiny",
            "dtype": "bf16",
            "device": "cpu",
            "threads": 2,
            "chunk_tokens": 64,
            "chunk_bytes": 65536,
        },
        tiers=[{"name": "dram", "url": "memory://"}, {"name": "disk", "url": "slab://d"}],
        profile={"source": "file", "reason": "cached", "measured": [], "seconds": 1.5},
        break_even={"dram": {"tokens": 128, "checks": []}, "disk": {"tokens": None, "checks": []}},
        requests=[request(i) for i in range(len(DECISIONS))],
        cache={
            "lookup_chunks": 40,
            "tiers": {
                "dram": {"hits": 10, "bytes_read": 3 << 20, "bytes_written": 5 << 20},
                "disk": {"hits": 2, "bytes_read": 1 << 20, "bytes_written": 9 << 20},
            },
        },
        timing={"wall_s": 9.0},
        load_average=[0.5, 0.4, 0.3],
    )


def test_the_figures_add_up():
    s = report().summary()
    assert s["requests"] == 4 and s["requests_same_tokens"] == 3
    assert s["decisions"]["counts"] == {"load": 1, "partial": 1, "recompute": 1, "miss": 1}
    assert s["decisions"]["measured"] == 2 and s["decisions"]["chose_faster"] == 1
    assert s["tokens"]["prompt"] == 300 + 350 + 400 + 450
    assert s["tokens"]["reused"] == 64 * (0 + 1 + 2 + 3)
    assert s["tiers"]["dram"]["loaded_chunks"] == 6 and s["tiers"]["disk"]["loaded_chunks"] == 2
    assert s["tiers"]["dram"]["hit_tokens"] == 640 and s["tokens"]["hit_tokens"] == 768
    assert s["ttft"]["kvtier_median_s"] == 0.2


def test_the_json_holds_every_request_and_the_summary_in_order():
    doc = json.loads(report().to_json())
    assert list(doc) == [
        "schema",
        "summary",
        "model",
        "tiers",
        "profile",
        "break_even",
        "admission",
        "timing",
        "load_average",
        "config",
        "requests",
        "cache",
    ]
    assert doc["schema"] == SCHEMA and len(doc["requests"]) == 4
    first = doc["requests"][1]
    assert list(first)[:12] == [
        "index",
        "session",
        "kind",
        "turn",
        "prompt_tokens",
        "shared_tokens",
        "generated",
        "tokens_match",
        "logits_max_diff",
        "ttft_kvtier_s",
        "ttft_recompute_s",
        "saved_s",
    ]
    assert first["saved_s"] == first["ttft_recompute_s"] - first["ttft_kvtier_s"]
    assert first["decision"]["tiers"] == ["dram"] and first["decision"]["action"] == "load"


def test_the_table_shows_every_request_and_tier():
    console = Console(record=True, width=200)
    render(report(), console)
    text = console.export_text()
    assert "kvtier run: tiny bf16 on cpu (2 threads), chunk 64 tokens" in text
    assert "dram:1,disk:0" in text and "partial ✗" in text and "load ✓" in text
    assert "128 tokens" in text and "never" in text
    assert "decisions: load 1, partial 1, recompute 1, miss 1" in text
    assert "median 200.0 ms vs 475.0 ms" in text


def test_plots_are_written(tmp_path):
    paths = write_plots(report(), tmp_path / "plots")
    assert [p.name for p in paths] == ["run-ttft.png", "run-tiers.png", "run-predictions.png"]
    assert all(p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)
