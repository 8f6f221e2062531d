"""The payload digest: the numpy and torch forms agree, and damage changes it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.codec.digest import combine, payload_digest, tensor_digest


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 4096, (1 << 20) + 3])
def test_numpy_and_torch_agree(n: int) -> None:
    a = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    assert payload_digest(a) == tensor_digest(torch.from_numpy(a))


def test_matches_the_definition_with_python_integers() -> None:
    a = np.random.default_rng(3).integers(0, 256, 8 * 500 + 5, dtype=np.uint8)
    padded = bytes(a) + b"\x00" * 3
    words = [int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8)]
    s1 = sum(words)
    s2 = sum((i + 1) * w for i, w in enumerate(words))
    assert payload_digest(a) == combine(s1, s2)
    assert combine(s1, s2) < 1 << 64


def test_bf16_tensor_and_an_unaligned_view() -> None:
    t = torch.randn(4, 33, dtype=torch.bfloat16)
    raw = t.view(torch.uint8).reshape(-1)
    assert tensor_digest(t) == payload_digest(raw.numpy())
    assert tensor_digest(raw[3:]) == payload_digest(raw.numpy()[3:])


def test_flipped_bits_and_swapped_words_change_it() -> None:
    a = np.random.default_rng(5).integers(0, 256, 4096, dtype=np.uint8)
    base = payload_digest(a)
    for byte in (0, 7, 2048, 4095):
        for bit in (0, 7):
            b = a.copy()
            b[byte] ^= 1 << bit
            assert payload_digest(b) != base
    w = a.copy().view("<u8")
    w[[3, 9]] = w[[9, 3]]
    assert payload_digest(w.view(np.uint8)) != base


def test_many_at_once_equal_one_by_one() -> None:
    from kvtier.codec.digest import tensor_digests

    rng = np.random.default_rng(9)
    arrays = [rng.integers(0, 256, n, dtype=np.uint8) for n in (0, 5, 4096, 70001)]
    tensors = [torch.from_numpy(a) for a in arrays]
    assert tensor_digests(tensors) == [payload_digest(a) for a in arrays]
    assert tensor_digests([]) == []


def test_parts_give_the_digest_of_the_whole() -> None:
    a = np.random.default_rng(11).integers(0, 256, 3 * 4096 + 13, dtype=np.uint8)
    whole = payload_digest(a)
    assert payload_digest(a[:4096], a[4096:8192], a[8192:]) == whole  # summed where they lie
    assert payload_digest(a[:5], a[5:]) == whole  # a split inside a word: joined first
    assert payload_digest() == payload_digest(b"")
