"""The real-KV corpus: prompts of each kind, the model's KV in 256-token chunks as the HF engine
stores them, computed once and read back from its folder."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from kvtier.engines.kv_corpus import (
    KINDS,
    load_corpus,
    prompt_text,
    sample_chunks,
)
from kvtier.errors import ConfigError


def test_sample_chunks_spread_over_the_prompt():
    assert sample_chunks(32, 1) == [16]
    assert sample_chunks(32, 2) == [0, 31]
    assert sample_chunks(4, 3) == [0, 2, 3]
    assert sample_chunks(3, 8) == [0, 1, 2]


def test_prompts_of_each_kind_are_seeded_and_differ():
    for kind in KINDS:
        assert prompt_text(kind, 1, 200) == prompt_text(kind, 1, 200)
        assert prompt_text(kind, 1, 200) != prompt_text(kind, 2, 200)
    with pytest.raises(ConfigError):
        prompt_text("poetry", 0, 10)


@pytest.mark.slow
def test_corpus_is_the_models_kv_in_chunks_and_is_kept(tmp_path):
    said: list[str] = []
    items = load_corpus(("bf16",), ("chat",), (512,), 2, said.append, tmp_path)
    assert [(i.kind, i.tokens) for i in items] == [("chat", 512)]
    for item in items:
        assert item.chunks.dtype == np.uint16 and item.chunks.shape[0] == 2
        assert item.shape == (30, 2, 3, 256, 64)  # SmolLM2-135M: layers, k/v, heads, tokens, dim
        assert len(np.unique(item.chunks[0, 0, 0, 0, :, 0])) > 16  # real values, not filler
    assert any("loading the model" in s for s in said)
    said.clear()
    again = load_corpus(("bf16",), ("chat",), (512,), 1, said.append, tmp_path)
    assert not said  # read back, nothing computed
    assert np.array_equal(again[0].chunks[0], items[0].chunks[1])  # a sample of the kept sample


@pytest.mark.slow
def test_one_fp32_forward_per_prompt_gives_every_dtype(tmp_path):
    import torch

    said: list[str] = []
    items = load_corpus(("bf16", "fp16"), ("prose",), (512,), 1, said.append, tmp_path)
    assert [s for s in said if s.startswith("real KV ")] == [
        "real KV 1/1: a 512-token prose prompt"
    ]
    bf16, fp16 = (torch.from_numpy(i.chunks.copy()) for i in items)
    as_bf16 = bf16.view(torch.bfloat16).float()
    as_fp16 = fp16.view(torch.float16).float()
    # the same KV in both dtypes: equal within bf16's rounding, and not all zeros
    assert torch.allclose(as_bf16, as_fp16, rtol=1 / 64, atol=1e-3)
    assert as_fp16.abs().max() > 0.1
