"""Cross-process reuse through the shared tiers with the real model: a "prefill worker" process
computes a long prompt's KV and stores it in Redis and S3 (real servers); a "decode worker"
process, with another PYTHONHASHSEED and empty host-memory and disk tiers of its own, finds every
chunk in the shared tier, loads it from there and generates the tokens a full recompute gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.services, pytest.mark.slow]

CHUNK = 32
PROMPT_TOKENS = 300  # 9 full chunks and a tail
NEW = 8

_WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from kvtier.cache import CacheConfig, TieredCache
    from kvtier.engines import HFEngine, load_model, model_namespace
    from kvtier.tiers.registry import open_tier

    job = json.loads(sys.stdin.read())
    ids = torch.tensor(job["prompt"])
    loaded = load_model(None, "fp32", tokenizer=False)
    ns = model_namespace(loaded.model, loaded.model_id, loaded.fingerprint)
    out = {"hashseed": os.environ.get("PYTHONHASHSEED"), "runs": []}
    for stack in job["stacks"]:
        tiers = [open_tier(url, ns.id) for url in stack]
        cache = TieredCache(tiers, CacheConfig(chunk_tokens=32))
        with HFEngine(loaded.model, cache, namespace=ns) as engine:
            result = engine.generate(ids, job["new"])
            assert engine.flush(timeout=120)
        cache.close()
        for tier in tiers:
            tier.close()
        out["runs"].append({"tokens": result.tokens, "record": result.record.as_dict()})
    if job["recompute"]:
        with HFEngine(loaded.model, None, namespace=ns) as plain:  # no kvtier at all
            out["recompute"] = plain.generate(ids, job["new"]).tokens
    print(json.dumps(out))
    """
)


def _worker(
    stacks: list[list[str]], prompt: list[int], hashseed: int, env: dict, recompute: bool = False
) -> dict:
    job = {"stacks": stacks, "prompt": prompt, "new": NEW, "recompute": recompute}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env, "PYTHONHASHSEED": str(hashseed)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_decode_worker_loads_what_the_prefill_worker_stored(
    redis_server, s3_server, tmp_path, smol_fp32
):
    gen = torch.Generator().manual_seed(77)
    prompt = torch.randint(3, 49152, (PROMPT_TOKENS,), generator=gen).tolist()
    prefix = f"xp-{tmp_path.name}"
    shared = {
        "redis": f"{redis_server.url}?prefix={prefix}&timeout=1&name=redis",
        "s3": f"s3://kvtier-xp/{prefix}?endpoint={s3_server.endpoint}&create=1&timeout=5&name=s3",
    }

    def local(worker: str, kind: str) -> list[str]:
        return [
            "memory://?size=64MiB&name=dram",
            f"file://{tmp_path / worker / kind}?size=256MiB&sync=0&name=disk",
        ]

    # the prefill worker computes once and writes through to both shared tiers
    prefill = _worker([[*local("prefill", "all"), *shared.values()]], prompt, 1, s3_server.env)
    decode = _worker(
        [[*local("decode", k), url] for k, url in shared.items()],
        prompt,
        2,
        s3_server.env,
        recompute=True,
    )
    assert (prefill["hashseed"], decode["hashseed"]) == ("1", "2")
    chunks = PROMPT_TOKENS // CHUNK
    wrote = prefill["runs"][0]
    assert wrote["record"]["loaded_chunks"] == 0  # fresh tiers: computed
    assert wrote["record"]["stored_chunks"] == chunks
    for kind, read in zip(shared, decode["runs"], strict=True):
        got = read["record"]
        # every chunk from the shared tier: the decode worker's DRAM and disk held nothing
        assert got["hit_chunks"] == chunks and got["loaded_chunks"] == chunks, kind
        assert got["per_tier"] == {kind: chunks} and got["tier"] == kind
        assert got["reused_tokens"] == chunks * CHUNK and got["stored_chunks"] == 0, kind
        assert read["tokens"] == wrote["tokens"] == decode["recompute"], kind
