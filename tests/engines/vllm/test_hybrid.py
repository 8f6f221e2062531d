"""kvtier's connector with vLLM's hybrid KV-cache manager, on tiny random-weight models built
here (a Llama whose layers alternate sliding-window and full attention: two KV-cache groups;
and a Mamba model, whose state is no per-token KV).

The hybrid model: vLLM alone computes a prompt twice (the second time its prefix from vLLM's own
cache), and kvtier's engine (vLLM's prefix cache off) computes it, stores it, and loads the
prefix from kvtier the second time: both groups' blocks (the sliding window's outside the window
are vLLM's null block, never written) come back, and the greedy tokens are the same. The Mamba
model is refused when the engine starts, in one line naming the group kind.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from kvtier.engines.vllm.records import read_records
from kvtier.harness.vllm_probe import Probe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def hybrid_runs(tmp_path_factory):
    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.testing.tiny_models import tiny_llama, tiny_mamba

    work = tmp_path_factory.mktemp("hybrid")
    source = embedded_model_folder()[0]  # its tokenizer and vocabulary
    mixed = tiny_llama(work / "mixed", source, ["sliding_attention", "full_attention"] * 2, 256)
    mamba = tiny_mamba(work / "mamba", source)
    host = Path(f"/dev/shm/kvtier-hybrid-{uuid.uuid4().hex[:8]}")
    prompt = list(range(1000, 2100))  # 1,100 tokens: four whole chunks, a window of 256
    # the first run's stores land before the second asks (a request that comes while they are
    # still being written misses them and computes, as designed)
    twice = [{"prompts": [prompt], "max_tokens": 16}, {"sleep": 2}]
    twice.append(twice[0])
    tiers = [f"slab://{host}?size=64MiB", f"slab://{work}/disk?size=256MiB"]
    probes = [
        Probe({"model": str(mixed), "one_process": True, "steps": twice}, work, "alone"),
        Probe(
            {
                "model": str(mixed),
                "one_process": True,
                "prefix_caching": False,
                "steps": twice,
                "connector": {"tiers": tiers, "records": str(work / "records.jsonl")},
            },
            work,
            "kvtier",
        ),
        Probe(
            {
                "model": str(mamba),
                "one_process": True,
                "steps": twice,
                "connector": {"tiers": [f"slab://{work}/mamba?size=64MiB"]},
            },
            work,
            "mamba",
        ),
    ]
    try:
        alone, kvtier = probes[0].result(600), probes[1].result(600)
        with pytest.raises(RuntimeError) as refused:
            probes[2].result(600)
    finally:
        for p in probes:
            if p.proc.poll() is None:
                p.kill()
        shutil.rmtree(host, ignore_errors=True)
    return {
        "alone": alone,
        "kvtier": kvtier,
        "records": read_records(work / "records.jsonl"),
        "mamba_log": str(refused.value),
        "kvtier_log": (work / "kvtier.log").read_text(),
    }


def test_a_sliding_window_hybrid_loads_both_groups_and_gives_the_same_tokens(hybrid_runs):
    assert "kv cache group sizes (128, 128)" in hybrid_runs["kvtier_log"]  # two groups: HMA on
    assert "Turning off hybrid kv cache manager" not in hybrid_runs["kvtier_log"]
    first, again = hybrid_runs["records"]
    assert first["loaded_tokens"] == 0 and again["loaded_tokens"] == 1024
    assert again["failed_blocks"] == 0
    assert hybrid_runs["kvtier"][2]["tokens"] == hybrid_runs["alone"][2]["tokens"]


def test_a_group_kind_kvtier_cannot_move_is_refused_at_start_up_in_one_line(hybrid_runs):
    lines = [
        line for line in hybrid_runs["mamba_log"].splitlines() if "ConfigError: kvtier's" in line
    ]
    assert lines and "KV-cache group 0 is MambaSpec" in lines[-1]
