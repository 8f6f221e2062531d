"""Chunk keys: stable across processes, chained, and never shared between namespaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.keys import KEY_BYTES, PLAIN, ChunkKeyer, KeyInputs, Namespace, PromptEmbeds, Span
from kvtier.specs.model import ModelSpec

NS = Namespace("model-a", "rev-1", "bf16", layers=4, kv_heads=2, head_dim=64)
TOKENS = list(range(1000, 1000 + 1030))  # 4 full chunks of 256 and a partial tail of 6

_CHILD = """
import json, sys
from kvtier.keys import ChunkKeyer, KeyInputs, Namespace, Span
ns = Namespace("model-a", "rev-1", "bf16", layers=4, kv_heads=2, head_dim=64, tenant="t")
inputs = KeyInputs(adapter="lora-7", salt="s", spans=(Span("mm", "img", 300, 40),))
keys = ChunkKeyer(ns, 256).keys(list(range(1000, 2030)), inputs)
print(json.dumps([ns.id.hex()] + [k.hex() for k in keys]))
"""


def _child_keys(hashseed: str) -> list[str]:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_two_processes_with_different_hash_seeds_compute_the_same_keys():
    first, second = _child_keys("1"), _child_keys("4242")
    assert first == second
    ns = replace(NS, tenant="t")
    inputs = KeyInputs(adapter="lora-7", salt="s", spans=(Span("mm", "img", 300, 40),))
    here = ChunkKeyer(ns, 256).keys(list(range(1000, 2030)), inputs)
    assert first == [ns.id.hex()] + [k.hex() for k in here]


def test_key_format_is_pinned():
    """A golden value: changing the key format silently would orphan every stored block."""
    keys = ChunkKeyer(NS, 4).keys([1, 2, 3, 4, 5, 6, 7, 8])
    assert len(keys) == 2 and all(len(k) == KEY_BYTES for k in keys)
    assert keys[0].hex() == "6347b497a2649e60512daad361161463"


def test_partial_last_chunk_is_not_keyed_by_default():
    keyer = ChunkKeyer(NS, 256)
    assert len(keyer.keys(TOKENS)) == 4
    assert keyer.chunk_count(len(TOKENS)) == 4
    with_tail = keyer.keys(TOKENS, partial=True)
    assert len(with_tail) == 5 and keyer.chunk_count(len(TOKENS), partial=True) == 5
    assert with_tail[:4] == keyer.keys(TOKENS)
    assert keyer.keys(TOKENS[:255]) == []


def test_keys_are_chained_prefixes():
    keyer = ChunkKeyer(NS, 256)
    base = keyer.keys(TOKENS)
    changed = list(TOKENS)
    changed[300] += 1  # inside chunk 1
    other = keyer.keys(changed)
    assert other[0] == base[0]
    assert all(a != b for a, b in zip(other[1:], base[1:], strict=True))
    assert len(set(base)) == len(base)
    # the same chunk content at another position has another key (the parent differs)
    repeated = keyer.keys([7] * 512)
    assert repeated[0] != repeated[1]


def test_numpy_and_list_inputs_agree():
    keyer = ChunkKeyer(NS, 256)
    assert keyer.keys(np.array(TOKENS, dtype=np.int64)) == keyer.keys(TOKENS)
    assert keyer.keys(np.array(TOKENS, dtype=np.uint32)) == keyer.keys(TOKENS)


@pytest.mark.parametrize(
    "other",
    [
        replace(NS, model_id="model-b"),
        replace(NS, fingerprint="rev-2"),
        replace(NS, kv_dtype="fp8"),
        replace(NS, layout="token-layer-kv-head-dim"),
        replace(NS, tp_size=2, tp_rank=0),
        replace(NS, tp_size=2, tp_rank=1),
        replace(NS, kv_heads=1),
        NS.with_tenant("tenant-x"),
    ],
    ids=["model", "fingerprint", "dtype", "layout", "tp0of2", "tp1of2", "kv-heads", "tenant"],
)
def test_two_namespaces_never_share_a_key(other):
    mine = set(ChunkKeyer(NS, 256).keys(TOKENS))
    theirs = set(ChunkKeyer(other, 256).keys(TOKENS))
    assert other.id != NS.id
    assert mine.isdisjoint(theirs)


def test_tenants_x_and_y_do_not_share_keys():
    x = ChunkKeyer(NS.with_tenant("X"), 256).keys(TOKENS)
    y = ChunkKeyer(NS.with_tenant("Y"), 256).keys(TOKENS)
    assert set(x).isdisjoint(y)
    assert ChunkKeyer(NS.with_tenant("X"), 256).keys(TOKENS) == x


def test_tp_ranks_of_one_model_get_distinct_namespaces():
    spec = ModelSpec("m", layers=2, attention_heads=8, kv_heads=4, head_dim=64, total_params=1e9)
    ids = {Namespace.for_model(spec, "rev", tp_size=2, tp_rank=r).id for r in range(2)}
    assert len(ids) == 2
    assert Namespace.for_model(spec, "rev", tp_size=2).kv_heads == 2


def test_plain_keys_are_the_keys_stored_before_key_inputs_existed():
    """Blocks a disk tier holds from before key inputs stay hits for plain requests."""
    ns = Namespace("smollm2", "abc123", "bfloat16", 30, 3, 64, layout="vllm-cpu-vec-block128")
    keys = ChunkKeyer(ns, 256).keys(list(range(1000, 1600)), partial=True)
    assert [k.hex() for k in keys] == [
        "d19bd879b4085b5539c45443907bc94d",
        "a9b2050b19f620c33b74d05faa26e919",
        "7371940728b82dedd8badeeaa19f9581",
    ]
    assert ChunkKeyer(ns, 256).keys(list(range(1000, 1600)), KeyInputs()) == keys[:2]
    assert KeyInputs().empty and PLAIN.kinds() == []


INPUTS = {
    "adapter": KeyInputs(adapter="A\x00/adapters/a\x00f1"),
    "adapter-b": KeyInputs(adapter="B\x00/adapters/b\x00f2"),
    "salt": KeyInputs(salt="tenant-a"),
    "salt-b": KeyInputs(salt="tenant-b"),
    "mm": KeyInputs(spans=(Span("mm", "image:h1", 300, 100),)),
    "mm-other-item": KeyInputs(spans=(Span("mm", "image:h2", 300, 100),)),
    "mm-moved": KeyInputs(spans=(Span("mm", "image:h1", 301, 100),)),
    "embeds": KeyInputs(embeds=PromptEmbeds(np.zeros((1030, 8), np.uint8), "bfloat16")),
    "embeds-other": KeyInputs(embeds=PromptEmbeds(np.ones((1030, 8), np.uint8), "bfloat16")),
}


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_a_key_input_makes_keys_no_plain_request_and_no_other_input_shares(name):
    keyer = ChunkKeyer(NS, 256)
    mine = keyer.keys(TOKENS, INPUTS[name])
    assert keyer.keys(TOKENS, INPUTS[name]) == mine  # deterministic
    first_changed = 1 if name.startswith("mm") else 0  # the span starts in chunk 1
    assert mine[:first_changed] == keyer.keys(TOKENS)[:first_changed]
    assert set(mine[first_changed:]).isdisjoint(keyer.keys(TOKENS))
    for other, inputs in INPUTS.items():
        if other != name:
            assert mine[-1] != keyer.keys(TOKENS, inputs)[-1], other


def test_the_salt_enters_the_first_chunk_and_the_adapter_every_chunk():
    keyer = ChunkKeyer(NS, 256)
    salt = KeyInputs(salt="s")
    assert salt.parts(0, 256) == [b"salt\x00s"] and salt.parts(256, 512) == []
    adapter = KeyInputs(adapter="a")
    assert adapter.parts(0, 256) == adapter.parts(512, 768) == [b"adapter\x00a"]
    # nothing after a salted first chunk matches any other salt's chain, or no salt's
    assert set(keyer.keys(TOKENS, salt)).isdisjoint(keyer.keys(TOKENS, KeyInputs(salt="t")))


def test_a_multimodal_item_enters_the_chunks_it_overlaps_with_its_offset():
    item = Span("mm", "image:h", 250, 300)  # tokens 250..549: chunks 0, 1 and 2
    inputs = KeyInputs(spans=(item,))
    assert inputs.parts(0, 256) and inputs.parts(256, 512) and inputs.parts(512, 768)
    assert inputs.parts(768, 1024) == []
    assert inputs.parts(0, 256) != inputs.parts(256, 512)  # the offset differs per chunk
    keyer = ChunkKeyer(NS, 256)
    # two images behind the same placeholder tokens: different keys from the item's first chunk
    other = KeyInputs(spans=(Span("mm", "image:g", 250, 300),))
    assert set(keyer.keys(TOKENS, inputs)).isdisjoint(keyer.keys(TOKENS, other))
    assert inputs.kinds() == ["mm"]


def test_prompt_embeddings_key_each_chunk_by_its_own_rows():
    rows = np.arange(1030 * 4, dtype=np.uint32).view(np.uint8).reshape(1030, 16)
    keyer = ChunkKeyer(NS, 256)
    mine = keyer.keys(TOKENS, KeyInputs(embeds=PromptEmbeds(rows, "float32")))
    changed = rows.copy()
    changed[700, 3] ^= 1  # inside chunk 2
    theirs = keyer.keys(TOKENS, KeyInputs(embeds=PromptEmbeds(changed, "float32")))
    assert mine[:2] == theirs[:2] and set(mine[2:]).isdisjoint(theirs[2:])
    other_dtype = keyer.keys(TOKENS, KeyInputs(embeds=PromptEmbeds(rows, "bfloat16")))
    assert set(mine).isdisjoint(other_dtype)
    # a mixed prompt: the same rows with another token/embedding mask are other inputs
    mask = np.zeros(1030, bool)
    masked = keyer.keys(TOKENS, KeyInputs(embeds=PromptEmbeds(rows, "float32", mask)))
    assert set(mine).isdisjoint(masked)
    with pytest.raises(ConfigError):
        PromptEmbeds(np.zeros(8, np.uint8), "float32")
    with pytest.raises(ConfigError):
        PromptEmbeds(rows, "float32", np.zeros(3, bool))


def test_key_inputs_cannot_be_forged_by_token_ids_or_by_each_other():
    """Bytes of one input must not be able to pose as another input or as a chunk's tokens."""
    keyer = ChunkKeyer(NS, 8)
    forged = [0x1F000001, 0, 0, 0, 0, 11, 12, 13]
    with_salt = keyer.keys([11, 12, 13], KeyInputs(salt="\x00" * 16 + "\x01"), partial=True)
    assert with_salt[0] != keyer.keys(forged)[0]
    # an adapter named like a salt part, or a salt carrying an adapter's bytes, are other keys
    tokens = list(range(8))
    a = keyer.keys(tokens, KeyInputs(adapter="x", salt="y"))
    b = keyer.keys(tokens, KeyInputs(adapter="x\x00salt\x00y"))
    c = keyer.keys(tokens, KeyInputs(salt="y\x00adapter\x00x"))
    assert len({a[0], b[0], c[0]}) == 3
    with pytest.raises(ConfigError):
        Span("mm", "", 0, 4)
    with pytest.raises(ConfigError):
        Span("mm", "h", 0, 0)


def test_out_of_range_token_ids_are_refused_not_wrapped():
    keyer = ChunkKeyer(NS, 2)
    with pytest.raises(ConfigError):
        keyer.keys(np.array([-1, 5]))
    with pytest.raises(ConfigError):
        keyer.keys(np.array([2**32 + 5, 5]))
    with pytest.raises(ConfigError):
        keyer.keys(np.array([1.5, 2.0]))
    with pytest.raises(ConfigError):
        keyer.keys([[1, 2], [3, 4]])
    assert keyer.keys([]) == []


def test_bad_namespaces_and_chunk_sizes_are_refused():
    with pytest.raises(ConfigError):
        Namespace("", "rev", "bf16", 1, 1, 1)
    with pytest.raises(ConfigError):
        Namespace("m", "rev", "bf16", 1, 1, 1, tp_rank=2, tp_size=2)
    with pytest.raises(ConfigError):
        ChunkKeyer(NS, 0)
