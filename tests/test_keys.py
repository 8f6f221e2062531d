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
from kvtier.keys import KEY_BYTES, ChunkKeyer, Namespace
from kvtier.specs.model import ModelSpec

NS = Namespace("model-a", "rev-1", "bf16", layers=4, kv_heads=2, head_dim=64)
TOKENS = list(range(1000, 1000 + 1030))  # 4 full chunks of 256 and a partial tail of 6

_CHILD = """
import json, sys
from kvtier.keys import ChunkKeyer, Namespace
ns = Namespace("model-a", "rev-1", "bf16", layers=4, kv_heads=2, head_dim=64, tenant="t")
keys = ChunkKeyer(ns, 256).keys(list(range(1000, 2030)), extra=["lora-7", b"img"])
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
    here = ChunkKeyer(ns, 256).keys(list(range(1000, 2030)), extra=["lora-7", b"img"])
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


def test_extra_keys_change_every_key_and_their_order_matters():
    keyer = ChunkKeyer(NS, 256)
    plain = keyer.keys(TOKENS)
    lora = keyer.keys(TOKENS, extra=["lora-1"])
    assert set(plain).isdisjoint(lora)
    assert set(lora).isdisjoint(keyer.keys(TOKENS, extra=["lora-2"]))
    assert keyer.keys(TOKENS, extra=["a", "b"]) != keyer.keys(TOKENS, extra=["b", "a"])
    assert keyer.keys(TOKENS, extra=["ab"]) != keyer.keys(TOKENS, extra=["a", "b"])
    assert keyer.keys(TOKENS, extra=[""]) != plain
    assert keyer.keys(TOKENS, extra=["lora-1"]) == lora


def test_extra_keys_cannot_be_forged_by_token_ids():
    """Bytes of an extra key must not be able to pose as the start of a chunk's tokens."""
    keyer = ChunkKeyer(NS, 8)
    # tokens whose bytes start with what an unframed extra key + separator would look like
    forged = [0x1F000001, 0, 0, 0, 0, 11, 12, 13]
    extra = b"\x00" * 16 + b"\x01\x00\x00"
    with_extra = keyer.keys([11, 12, 13], extra=[extra], partial=True)
    assert with_extra[0] != keyer.keys(forged)[0]


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
