"""Exact mode: with and without kvtier, the same logits bit for bit and the same tokens.

In exact mode the engine prefills in forwards cut at chunk boundaries, with or without a cache.
"Without kvtier" is the engine with no cache at all, which is plain transformers fed the prompt
chunk by chunk (checked against a loop written here). Reloaded chunks, from DRAM, from disk and
from another process, must then reproduce its logits bit for bit in bf16 and fp32.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from kvtier.cache import CacheConfig, TieredCache  # noqa: E402
from kvtier.engines.hf import HFEngine, forward_keywords, model_namespace  # noqa: E402
from kvtier.tiers.registry import open_tier  # noqa: E402

CHUNK = 32
NEW = 5


def _chunked_transformers(model, ids, new: int) -> tuple[torch.Tensor, list[int]]:
    """Plain transformers: prefill ``ids`` chunk by chunk, then greedy decode."""
    from transformers import DynamicCache

    kw, _ = forward_keywords(model)  # the name this transformers version takes
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        for start in range(0, ids.numel(), CHUNK):
            piece = ids[start : start + CHUNK].unsqueeze(0)
            out = model(piece, **{kw: cache}, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1]
        tokens = [int(torch.argmax(logits))]
        while len(tokens) < new:
            step = torch.tensor([[tokens[-1]]])
            out = model(step, **{kw: cache}, use_cache=True, logits_to_keep=1)
            tokens.append(int(torch.argmax(out.logits[0, -1])))
    return logits, tokens


def _plain(loaded) -> HFEngine:
    return HFEngine.from_loaded(loaded, None, chunk_tokens=CHUNK, exact=True)


@pytest.mark.slow
def test_exact_engine_without_cache_is_chunked_transformers(smol_bf16, prompt):
    result = _plain(smol_bf16).generate(prompt, NEW)
    logits, tokens = _chunked_transformers(smol_bf16.model, prompt, NEW)
    assert torch.equal(result.logits, logits)
    assert result.tokens == tokens


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "kind"), [("bf16", "memory"), ("bf16", "disk"), ("fp32", "memory")]
)
def test_exact_reuse_matches_no_kvtier_bit_for_bit(dtype, kind, request, engine_for, prompt):
    # 300 tokens stored, then 600: here (AVX2 CPU, bf16) one forward over the last 312 tokens
    # moves the logits by ~0.2 against one over all 600; chunk-aligned forwards do not.
    loaded = request.getfixturevalue(f"smol_{dtype}")
    engine = engine_for(loaded, kind, exact=True)
    plain = _plain(loaded)
    long = torch.cat([prompt, prompt.flip(0), prompt, prompt.flip(0)])
    head = long[:300]  # stores 9 chunks
    first = engine.generate(head, NEW)
    want = plain.generate(head, NEW)
    assert first.record.loaded_chunks == 0
    assert torch.equal(first.logits, want.logits) and first.tokens == want.tokens
    assert engine.flush(timeout=60)

    # A longer prompt over the stored head, then a second turn over prompt + answer.
    turn = long
    for _ in range(2):
        got, want = engine.generate(turn, NEW), plain.generate(turn, NEW)
        assert got.record.loaded_chunks >= 9 and got.record.tier == kind
        assert torch.equal(got.logits, want.logits), "reuse changed the logits"
        assert got.tokens == want.tokens
        assert engine.flush(timeout=60)
        turn = torch.cat([turn, torch.tensor(got.tokens), prompt[:40]])


@pytest.mark.slow
def test_exact_partial_load_matches_no_kvtier(smol_bf16, engine_for, prompt):
    engine = engine_for(smol_bf16, "memory", exact=True)
    engine.generate(prompt, 1)
    assert engine.flush(timeout=60)
    engine.decide = lambda q: 2
    got = engine.generate(prompt, NEW)
    assert got.record.loaded_chunks == 2
    forwards = got.record.forwards  # one per chunk from the first one not loaded
    assert [(n, p) for n, p, _ in forwards] == [(32, 64), (32, 96), (22, 128)]
    assert all(s > 0 for *_, s in forwards)
    want = _plain(smol_bf16).generate(prompt, NEW)
    assert torch.equal(got.logits, want.logits) and got.tokens == want.tokens


_WRITER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from kvtier.cache import CacheConfig, TieredCache
    from kvtier.engines import HFEngine, load_model, model_namespace
    from kvtier.tiers.registry import open_tier

    url = sys.argv[1]
    ids = torch.tensor(json.loads(sys.stdin.read()))
    loaded = load_model(None, "bf16", tokenizer=False)
    ns = model_namespace(loaded.model, loaded.model_id, loaded.fingerprint)
    tier = open_tier(url, ns.id)
    cache = TieredCache([tier], CacheConfig(chunk_tokens=32))
    engine = HFEngine(loaded.model, cache, namespace=ns, exact=True)
    result = engine.generate(ids, 1)
    assert engine.flush(timeout=120)
    engine.close(); cache.close(); tier.close()
    print(json.dumps({"stored": result.record.stored_chunks}))
    """
)


@pytest.mark.slow
def test_exact_reuse_across_processes(smol_bf16, tmp_path, prompt):
    url = f"file://{tmp_path / 'shared'}?size=1GiB"
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, url],
        input=json.dumps(prompt[:128].tolist()),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["stored"] == 4
    ns = model_namespace(smol_bf16.model, smol_bf16.model_id, smol_bf16.fingerprint)
    tier = open_tier(url, ns.id)
    cache = TieredCache([tier], CacheConfig(chunk_tokens=CHUNK))
    try:
        with HFEngine(smol_bf16.model, cache, namespace=ns, store=False, exact=True) as engine:
            got = engine.generate(prompt, NEW)
    finally:
        cache.close()
        tier.close()
    assert got.record.loaded_chunks == 4 and got.record.tier == "disk"
    want = _plain(smol_bf16).generate(prompt, NEW)
    assert torch.equal(got.logits, want.logits) and got.tokens == want.tokens
