"""The HF engine on the embedded model: with and without kvtier, the model computes the same.

"Without kvtier" is plain transformers: a full prefill, or (for a reused prefix) the same
prefix KV kept in memory and cropped, then the rest of the prompt. Reloading through the cache
must reproduce those logits bit for bit, and greedy tokens must match ``model.generate``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from kvtier.cache import CacheConfig, TieredCache  # noqa: E402
from kvtier.engines.hf import HFEngine, model_namespace, recompute_all  # noqa: E402
from kvtier.errors import ConfigError  # noqa: E402
from kvtier.tiers.registry import open_tier  # noqa: E402

CHUNK = 32
NEW = 6


def _reused(n: int) -> int:
    return (n - 1) // CHUNK * CHUNK


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_reload_from_memory_matches_transformers(dtype, request, engine_for, reference, prompt):
    loaded = request.getfixturevalue(f"smol_{dtype}")
    model = loaded.model
    engine = engine_for(loaded, "memory")
    full_logits, full_cache = reference.prefill(model, prompt)
    want_tokens = reference.generate(model, prompt, NEW)

    first = engine.generate(prompt, NEW)
    assert first.record.loaded_chunks == 0 and first.record.stored_chunks == len(prompt) // CHUNK
    assert torch.equal(first.logits, full_logits)
    assert first.tokens == want_tokens
    assert engine.flush(timeout=60)

    second = engine.generate(prompt, NEW)
    rec = second.record
    assert rec.hit_chunks == len(prompt) // CHUNK
    assert rec.reused_tokens == _reused(len(prompt)) and rec.tier == "memory"
    assert rec.computed_tokens == len(prompt) - rec.reused_tokens
    assert rec.load_bytes == rec.loaded_chunks * engine.layout.chunk_bytes(CHUNK)
    assert rec.stored_chunks == 0
    split = reference.split(model, prompt, full_cache, rec.reused_tokens)
    assert torch.equal(second.logits, split)  # bit for bit: the same KV, the same kernels
    assert second.tokens == want_tokens
    assert 0 < rec.prefill_s < rec.ttft_s and rec.lookup_s > 0 and rec.load_s > 0


@pytest.mark.slow
def test_extended_prompt_reuses_the_shared_prefix(smol_fp32, engine_for, reference, prompt):
    model = smol_fp32.model
    engine = engine_for(smol_fp32, "memory")
    head = prompt[:100]
    engine.generate(head, 1)
    engine.flush(timeout=60)
    _, head_cache = reference.prefill(model, head)
    result = engine.generate(prompt, NEW)
    assert result.record.reused_tokens == 96 and result.record.hit_chunks == 3
    assert result.record.stored_chunks == len(prompt) // CHUNK - 3
    with torch.inference_mode():
        head_cache.crop(96 - head_cache.get_seq_length())
        want = reference.forward(model, prompt[96:], head_cache)
    assert torch.equal(result.logits, want)
    assert result.tokens == reference.generate(model, prompt, NEW)


@pytest.mark.slow
def test_whole_prompt_cached_recomputes_its_last_chunk(smol_fp32, engine_for, reference, prompt):
    ids = prompt[:128]  # exactly four chunks
    engine = engine_for(smol_fp32, "memory")
    engine.generate(ids, 1)
    engine.flush(timeout=60)
    again = engine.generate(ids, NEW)
    assert again.record.hit_chunks == 3  # the last chunk is never needed
    assert again.record.reused_tokens == 96 and again.record.computed_tokens == 32
    _, cache = reference.prefill(smol_fp32.model, ids)
    assert torch.equal(again.logits, reference.split(smol_fp32.model, ids, cache, 96))
    one_chunk = engine.generate(ids[:CHUNK], 1)
    assert one_chunk.record.hit_chunks == 0 and one_chunk.record.reused_tokens == 0


@pytest.mark.slow
def test_decision_can_recompute_or_load_part(smol_fp32, engine_for, reference, prompt):
    engine = engine_for(smol_fp32, "memory", decide=recompute_all)
    engine.generate(prompt, 1)
    engine.flush(timeout=60)
    full_logits, full_cache = reference.prefill(smol_fp32.model, prompt)
    again = engine.generate(prompt, 1)
    assert again.record.hit_chunks == 4 and again.record.loaded_chunks == 0
    assert again.record.stored_chunks == 0 and torch.equal(again.logits, full_logits)
    seen = []
    engine.decide = lambda q: seen.append(q) or 1
    part = engine.generate(prompt, 1)
    assert part.record.loaded_chunks == 1 and part.record.reused_tokens == CHUNK
    assert seen[0].usable_chunks == 4 and seen[0].tier_names == ("memory",) * 4
    assert seen[0].kv_bytes_per_token == engine.layout.bytes_per_token
    assert torch.equal(part.logits, reference.split(smol_fp32.model, prompt, full_cache, CHUNK))


@pytest.mark.slow
def test_disk_tier_survives_a_restart(smol_fp32, tmp_path, reference, prompt):
    ns = model_namespace(smol_fp32.model, smol_fp32.model_id, smol_fp32.fingerprint)
    url = f"file://{tmp_path / 'kv'}?size=1GiB&sync=0"
    _, full_cache = reference.prefill(smol_fp32.model, prompt)
    for run in range(2):
        mem, disk = open_tier("memory://?size=64MiB", ns.id), open_tier(url, ns.id)
        cache = TieredCache([mem, disk], CacheConfig(chunk_tokens=CHUNK))
        with HFEngine(smol_fp32.model, cache, namespace=ns) as engine:
            result = engine.generate(prompt, NEW)
            engine.flush(timeout=60)
        cache.close()
        mem.close()
        disk.close()
        if run == 0:
            assert result.record.loaded_chunks == 0
    assert result.record.tier == "disk" and result.record.per_tier == {"disk": 4}
    assert torch.equal(result.logits, reference.split(smol_fp32.model, prompt, full_cache, 128))
    assert result.tokens == reference.generate(smol_fp32.model, prompt, NEW)


@pytest.mark.slow
def test_a_kv_coded_tier_gives_the_model_the_same_bits(smol_bf16, tmp_path, reference, prompt):
    """bf16 KV stored through the kv codec: the blocks are coded and the logits bit for bit."""
    model = smol_bf16.model
    ns = model_namespace(model, smol_bf16.model_id, smol_bf16.fingerprint)
    tier = open_tier(f"slab://{tmp_path / 'kv'}?size=256MiB&sync=0&codec=kv", ns.id)
    cache = TieredCache([tier], CacheConfig(chunk_tokens=CHUNK))
    _, full_cache = reference.prefill(model, prompt)
    try:
        with HFEngine(model, cache, namespace=ns) as engine:
            engine.generate(prompt, 1)
            assert engine.flush(timeout=60)
            key = next(iter(tier.iter_keys()))
            raw = engine.layout.chunk_bytes(CHUNK)
            header = tier.get_into(key, torch.empty(raw, dtype=torch.uint8).numpy())
            assert header.meta.codec == "kv" and header.stored_len < raw
            second = engine.generate(prompt, NEW)
    finally:
        cache.close()
        tier.close()
    assert second.record.loaded_chunks == 4
    assert torch.equal(second.logits, reference.split(model, prompt, full_cache, 128))
    assert second.tokens == reference.generate(model, prompt, NEW)


_WRITER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from kvtier.cache import CacheConfig, TieredCache
    from kvtier.engines import HFEngine, load_model, model_namespace
    from kvtier.tiers.registry import open_tier

    url, dtype = sys.argv[1], sys.argv[2]
    ids = torch.tensor(json.loads(sys.stdin.read()))
    loaded = load_model(None, dtype, tokenizer=False)
    ns = model_namespace(loaded.model, loaded.model_id, loaded.fingerprint)
    tier = open_tier(url, ns.id)
    cache = TieredCache([tier], CacheConfig(chunk_tokens=32))
    engine = HFEngine(loaded.model, cache, namespace=ns)
    result = engine.generate(ids, 4)
    assert engine.flush(timeout=120)
    engine.close(); cache.close(); tier.close()
    print(json.dumps({"tokens": result.tokens, "stored": result.record.stored_chunks}))
    """
)


@pytest.mark.slow
def test_another_process_loads_what_one_wrote(smol_fp32, tmp_path, reference, prompt):
    url = f"file://{tmp_path / 'shared'}?size=1GiB"
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, url, "fp32"],
        input=json.dumps(prompt.tolist()),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wrote = json.loads(done.stdout.strip().splitlines()[-1])
    assert wrote["stored"] == 4
    ns = model_namespace(smol_fp32.model, smol_fp32.model_id, smol_fp32.fingerprint)
    tier = open_tier(url, ns.id)
    cache = TieredCache([tier], CacheConfig(chunk_tokens=CHUNK))
    try:
        with HFEngine(smol_fp32.model, cache, namespace=ns, store=False) as engine:
            result = engine.generate(prompt, 4)
    finally:
        cache.close()
        tier.close()
    assert result.record.loaded_chunks == 4 and result.record.tier == "disk"
    _, full_cache = reference.prefill(smol_fp32.model, prompt)
    assert torch.equal(result.logits, reference.split(smol_fp32.model, prompt, full_cache, 128))
    assert result.tokens == wrote["tokens"]


@pytest.mark.slow
def test_bf16_cache_is_never_used_by_the_fp32_model(
    smol_bf16, smol_fp32, tmp_path, engine_for, reference, prompt
):
    ids = prompt[:100]
    shared = tmp_path / "shared"
    writer = engine_for(smol_bf16, "disk", disk_dir=shared)
    writer.generate(ids, 1)
    assert writer.flush(timeout=60)
    assert writer.lookup_hits(ids) == 3

    reader = engine_for(smol_fp32, "disk", disk_dir=shared)
    assert reader.namespace.id != writer.namespace.id
    assert set(reader.keys(ids)).isdisjoint(writer.keys(ids))
    assert reader.lookup_hits(ids) == 0
    result = reader.generate(ids, NEW)
    assert result.record.hit_chunks == 0 and result.record.loaded_chunks == 0
    full_logits, _ = reference.prefill(smol_fp32.model, ids)
    assert torch.equal(result.logits, full_logits)

    # Tiers opened for the bf16 namespace cannot be handed to the fp32 model at all.
    with pytest.raises(ConfigError, match="namespace"):
        HFEngine(smol_fp32.model, writer.cache, namespace=reader.namespace)


def test_engine_needs_a_namespace(smol_fp32):
    with pytest.raises(ConfigError, match="fingerprint"):
        HFEngine(smol_fp32.model)
    with pytest.raises(ConfigError, match="empty"):
        HFEngine.from_loaded(smol_fp32).prefill([])


def test_a_transformers_that_ignores_the_cache_is_refused_not_computed(smol_fp32, prompt):
    from kvtier.engines.hf import UnsupportedCacheError, forward_keywords

    kw, _ = forward_keywords(smol_fp32.model)
    assert kw in ("cache", "past_key_values")
    engine = HFEngine.from_loaded(smol_fp32)
    # what a transformers whose forward drops our cache keyword does: computes without it
    engine._cache_kw = "a_keyword_this_forward_ignores"
    with pytest.raises(UnsupportedCacheError, match="did not grow"):
        engine.generate(prompt[:40], 2)


def test_kv_reuse_needs_a_supported_transformers():
    from kvtier.engines.hf import UnsupportedCacheError, check_transformers

    check_transformers()  # the installed one: the hf extra pins the supported range
    for good in ("5.16.1", "5.19.0", "5.24.0"):
        check_transformers(good)
    for bad in ("5.15.9", "5.25.0", "6.0.0", "not-a-version"):
        with pytest.raises(UnsupportedCacheError, match="outside the range"):
            check_transformers(bad)


def test_without_cache_the_engine_is_plain_transformers(smol_fp32, reference, prompt):
    ids = prompt[:40]
    result = HFEngine.from_loaded(smol_fp32).generate(ids, NEW)
    logits, _ = reference.prefill(smol_fp32.model, ids)
    assert torch.equal(result.logits, logits)
    assert result.tokens == reference.generate(smol_fp32.model, ids, NEW)
    assert result.record.lookup_s == 0 and result.record.new_tokens == NEW


@pytest.mark.slow
def test_cost_policy_from_a_profile_decides(smol_fp32, engine_for, prompt):
    from kvtier.cost.calibration import (
        CalibrationProfile,
        PrefillFit,
        ProfileModel,
        TierFit,
        TransferFit,
    )
    from kvtier.engines.hf import from_policy
    from kvtier.policy.decision import LoadOrRecompute

    def decide(latency_s: float):
        bpt = smol_fp32.model.config.num_hidden_layers * 2 * 3 * 64 * 4
        profile = CalibrationProfile(
            model=ProfileModel("m", "f", "fp32", 30, 3, 64, bpt, CHUNK),
            prefill=PrefillFit(0.01, 1e-3, 0.0),
            tiers={"memory": TierFit("memory", "memory://", TransferFit(latency_s, 5e9))},
        )
        policy = LoadOrRecompute(profile.compute, bpt, profile.paths(), CHUNK)
        return from_policy(policy)

    engine = engine_for(smol_fp32, "memory", decide=decide(1e-5))
    engine.generate(prompt, 1)
    engine.flush(timeout=60)
    assert engine.generate(prompt, 1).record.loaded_chunks == 4
    engine.decide = decide(10.0)  # a tier 10 s away: recomputing 150 tokens is faster
    assert engine.generate(prompt, 1).record.loaded_chunks == 0


@pytest.mark.slow
def test_stored_chunks_carry_the_seconds_they_save(smol_fp32, engine_for, prompt):
    engine = engine_for(smol_fp32, "memory", chunk_value=lambda i: 0.5 + i)
    engine.generate(prompt, 1)
    assert engine.flush(timeout=60)
    memory = engine.cache.tiers[0]
    keys = engine.keys(prompt)
    out = bytearray(engine.layout.chunk_bytes(CHUNK))
    assert [memory.get_into(k, out).meta.value for k in keys] == [0.5 + i for i in range(len(keys))]
