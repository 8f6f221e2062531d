"""kvtier's connector over a shared Redis tier, across engine processes: a "prefill" engine
stores a prompt's KV through its host-memory tier into Redis and exits; a "decode" engine,
another process with another PYTHONHASHSEED and a fresh host-memory tier, loads the whole
prefix from Redis and generates the same greedy tokens as the prefill engine did when it computed
the prompt at the same split (its second pass over the prompt, the prefix from vLLM's own cache:
vLLM's CPU kernels are not bit-identical across splits, on AVX2 builds in particular)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from kvtier.engines.vllm.records import read_records
from kvtier.harness.vllm_probe import Probe

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(1500)]

SHORT = 16


def test_a_second_engine_loads_the_prefix_from_redis(redis_server, text_tokens, tmp_path):
    from kvtier.engines.vllm.scheduler import prompt_hash

    prompt = text_tokens[0:1100]
    tag = uuid.uuid4().hex[:8]
    shm = [Path(f"/dev/shm/kvtier-test-{tag}-{i}") for i in range(2)]
    shared = f"{redis_server.url}?prefix=vllm-{tag}&timeout=1&name=redis"
    go = tmp_path / "decode.go"
    probes: list[Probe] = []
    try:
        for i, name in enumerate(("prefill", "decode")):
            steps = [{"prompts": [prompt], "max_tokens": SHORT}]
            spec = {
                "connector": {
                    "tiers": [f"slab://{shm[i]}?size=96MiB", shared],
                    "records": str(tmp_path / f"{name}.jsonl"),
                },
                # prefill: computes the prompt (stored through to Redis), then again with the
                # 1,024-token prefix from vLLM's own cache, the split the decode engine loads at
                "prefix_caching": i == 0,
                "steps": steps * 2 if i == 0 else steps,
                "one_process": True,
            }
            if i:  # starts beside the prefill engine, computes once that one has exited
                spec["run_when"] = str(go)
            probes.append(Probe(spec, tmp_path, name, env={"PYTHONHASHSEED": str(i + 1)}))
        outs = [probes[0].result()]
        shutil.rmtree(shm[0], ignore_errors=True)  # nothing local survives the engine
        go.write_text("go\n")
        outs.append(probes[1].result())
    finally:
        for probe in probes:
            if probe.proc.poll() is None:
                probe.kill()
        for d in shm:
            shutil.rmtree(d, ignore_errors=True)
    records = [read_records(tmp_path / f"{name}.jsonl") for name in ("prefill", "decode")]
    h = prompt_hash(prompt)
    wrote = [r for r in records[0] if r["prompt_hash"] == h]
    (read,) = [r for r in records[1] if r["prompt_hash"] == h]
    assert wrote and all(r["loaded_tokens"] == 0 for r in wrote)  # computed, stored to Redis
    assert read["loaded_tokens"] == 1024 and set(read["hit_tokens"]) == {"redis"}
    assert outs[1][0]["tokens"] == outs[0][1]["tokens"]
