"""Inputs besides token ids keep KV apart inside real vLLM engines: LoRA adapters, cache salts,
prompt embeddings.

Two random LoRA adapters for the embedded model (made with peft, B matrices non-zero so each
changes the output) are served with ``enable_lora``; prompts with a ``cache_salt`` cross an
engine restart on a disk tier; prompts given as embeddings (the model's own embedding rows of a
text) have placeholder token ids that are all equal. Engines (each its own process):

- ``reference``: vLLM alone with its prefix cache (which keys every such input itself): every
  prompt computed whole, then again with the cached/computed split kvtier's loads give.
- ``kvtier``: kvtier on a disk ``slab://`` tier, vLLM's prefix cache off, so any reuse comes
  from kvtier.
- ``restart``: a new engine on the same disk tier once ``kvtier`` exited.
"""

from __future__ import annotations

import shutil

import pytest

from kvtier.engines.vllm.records import read_records
from kvtier.harness.vllm_probe import Probe

pytestmark = pytest.mark.timeout(1200)

TOKENS = 12


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, dict]:
    """LoRA adapters A and B: rank 8 on q_proj and v_proj, random A and B matrices."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from kvtier.engines.embedded import embedded_model_folder

    folder, _, _ = embedded_model_folder()
    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for seed, name in ((1, "A"), (2, "B")):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        config = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        )
        get_peft_model(model, config).save_pretrained(str(root / name))
        out[name] = {"name": name, "id": seed, "path": str(root / name)}
    return out


@pytest.fixture(scope="module")
def runs(text_tokens, adapters, tmp_path_factory):
    t = text_tokens
    P, Q, R = t[0:1100], t[1500:2600], t[3000:4100]
    A, B = adapters["A"], adapters["B"]
    work = tmp_path_factory.mktemp("keys")
    disk = work / "disk"
    engine = {"lora_rank": 8, "prompt_embeds": True, "one_process": True}

    def kvtier(name: str) -> dict:
        return {"tiers": [f"slab://{disk}?size=512MiB"], "records": str(work / f"{name}.jsonl")}

    def step(prompt, **kw) -> dict:
        return {"prompts": [prompt], "max_tokens": TOKENS, **kw}

    started: list[Probe] = []
    try:
        ref = Probe(
            {
                **engine,
                "prefix_caching": True,
                "steps": [
                    step(P, lora=A),
                    step(P, lora=B),
                    step(P, lora=A),
                    step(Q, cache_salt="a"),
                    step(Q, cache_salt="a"),
                    step(Q, embeds=True),
                    step(R, embeds=True),
                    step(Q, embeds=True),
                    step(P),
                    step(P),
                ],
            },
            work,
            "reference",
        )
        started.append(ref)
        first = Probe(
            {
                **engine,
                "connector": kvtier("kvtier"),
                "prefix_caching": False,
                "run_when": str(work / "kvtier.turn"),
                "steps": [
                    step(P, lora=A),
                    step(P, lora=B),
                    step(P, lora=A),
                    step(Q, cache_salt="a"),
                    step(Q, embeds=True),
                    step(R, embeds=True),
                    step(Q, embeds=True),
                    step(P),
                ],
            },
            work,
            "kvtier",
        )
        started.append(first)
        reference = ref.result(600)
        (work / "kvtier.turn").write_text("go\n")
        kvtier_out = first.result(600)
        restarted = Probe(
            {
                **engine,
                "connector": kvtier("restart"),
                "prefix_caching": False,
                "steps": [step(Q, cache_salt="b"), step(Q, cache_salt="a"), step(Q), step(P)],
            },
            work,
            "restart",
        )
        started.append(restarted)
        restart = restarted.result(600)
    finally:
        for p in started:
            if p.proc.poll() is None:
                p.kill()
    tokens = {
        "reference": [s["tokens"][0] for s in reference],
        "kvtier": [s["tokens"][0] for s in kvtier_out],
        "restart": [s["tokens"][0] for s in restart],
    }
    records = {n: read_records(work / f"{n}.jsonl") for n in ("kvtier", "restart")}
    shutil.rmtree(disk, ignore_errors=True)
    return {"tokens": tokens, "records": records}


def _hits(record: dict) -> int:
    return sum(record["hit_tokens"].values())


def test_the_adapters_change_the_output(runs):
    ref = runs["tokens"]["reference"]
    assert ref[0] != ref[1] and ref[0] != ref[8] and ref[1] != ref[8]


def test_a_request_under_adapter_b_never_gets_the_kv_adapter_a_computed(runs):
    ref, mine = runs["tokens"]["reference"], runs["tokens"]["kvtier"]
    records = runs["records"]["kvtier"]
    assert [r["key_inputs"] for r in records[:3]] == [["adapter"]] * 3
    assert _hits(records[1]) == 0 and records[1]["loaded_tokens"] == 0
    assert mine[1] == ref[1]  # B's tokens, as vLLM alone gives them
    # A again: kvtier's hit, A's tokens
    assert _hits(records[2]) == 1024 and records[2]["loaded_tokens"] == 1024
    assert mine[0] == ref[0] and mine[2] == ref[2]
    # the plain prompt gets neither adapter's KV
    assert _hits(records[7]) == 0 and mine[7] == ref[8]


def test_prompts_given_as_embeddings_load_only_their_own_kv(runs):
    ref, mine = runs["tokens"]["reference"], runs["tokens"]["kvtier"]
    records = runs["records"]["kvtier"]
    assert [r["key_inputs"] for r in records[4:7]] == [["embeds"]] * 3
    # R's embeddings behind the same placeholder ids as Q's: no hit, R's own tokens
    assert _hits(records[4]) == 0 and _hits(records[5]) == 0
    assert mine[4] == ref[5] and mine[5] == ref[6]
    assert _hits(records[6]) == 1024 and mine[6] == ref[7]


def test_a_salt_matches_only_itself_across_a_restart(runs):
    ref, mine = runs["tokens"]["reference"], runs["tokens"]["restart"]
    records = runs["records"]["restart"]
    assert runs["tokens"]["kvtier"][3] == ref[3]
    assert [r["key_inputs"] for r in records] == [["salt"], ["salt"], [], []]
    assert _hits(records[0]) == 0 and mine[0] == ref[3]  # salt b
    assert _hits(records[1]) == 1024 and mine[1] == ref[4]  # salt a: a hit, the same tokens
    assert _hits(records[2]) == 0 and mine[2] == ref[3]  # no salt


def test_plain_blocks_stay_hits_for_plain_requests_after_a_restart(runs):
    ref, mine = runs["tokens"]["reference"], runs["tokens"]["restart"]
    record = runs["records"]["restart"][3]
    assert _hits(record) == 1024 and record["loaded_tokens"] == 1024 and mine[3] == ref[9]
