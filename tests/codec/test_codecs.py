"""The codecs: every one gives back exactly the bytes it was given, for any bytes and shape;
damaged stored forms are a CorruptBlockError, never wrong bytes, a crash, a hang or an overrun."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.codec import (
    CODECS,
    BlockError,
    BlockMeta,
    CorruptBlockError,
    get_codec,
    pack_block,
    parse_header,
    unpack_into,
)
from kvtier.codec.planes import PLANE_DTYPES, channel_layout, merge_planes, split_planes

NS = bytes(range(16))
KEY = b"k" * 16
SHAPE = (2, 2, 3, 32, 16)  # layers, k/v, kv heads, tokens, head dim
CODED = [c.name for c in CODECS.values() if c.name != "raw"]


def _kv_like(dtype: str, seed: int = 0, shape=SHAPE) -> np.ndarray:
    """Values with per-channel scales, as KV has (bf16 or fp16 bit patterns as uint16)."""
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-6, 4, size=(*shape[:-2], 1, shape[-1])))
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).view(np.uint16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def _special_values(dtype: str) -> np.ndarray:
    """NaNs with payloads, ±Inf, ±0, subnormals, extremes (bit patterns)."""
    if dtype == "fp16":
        pats = [0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001, 0x83FF, 0x7E00, 0x7C01, 0xFFFF, 0x7BFF]
    else:
        pats = [0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F, 0x7FC0, 0x7F81, 0xFFFF, 0x7F7F]
    return np.array(pats, np.uint16)


def _round_trip(codec: str, data: bytes, dtype: str, shape=()) -> bytes:
    header, stored = pack_block(NS, KEY, data, BlockMeta(dtype, shape, codec))
    out = bytearray(len(data) + 7)  # a larger buffer: nothing beyond the raw length is written
    out[len(data) :] = b"\xa5" * 7
    got = unpack_into(header + bytes(stored), out, NS, KEY)
    assert got.raw_len == len(data)
    assert out[len(data) :] == b"\xa5" * 7
    return bytes(out[: len(data)])


@pytest.mark.parametrize("dtype", PLANE_DTYPES)
def test_kv_like_blocks_shrink_and_round_trip(dtype):
    data = _kv_like(dtype).tobytes()
    header, stored = pack_block(NS, KEY, data, BlockMeta(dtype, SHAPE, "kv"))
    assert parse_header(header).meta.codec == "kv"  # it gained, so it was kept
    assert stored.nbytes < 0.95 * len(data)
    for codec in CODED:
        assert _round_trip(codec, data, dtype, SHAPE) == data


def test_the_kv_codec_beats_plain_zstd_on_channel_structured_blocks():
    data = _kv_like("bf16", 3).tobytes()
    sizes = {c: pack_block(NS, KEY, data, BlockMeta("bf16", SHAPE, c))[1].nbytes for c in CODED}
    assert sizes["kv"] < sizes["zstd"]


@pytest.mark.parametrize("dtype", PLANE_DTYPES)
@pytest.mark.parametrize("codec", CODED)
def test_special_values_all_equal_and_random_blocks_round_trip(codec, dtype):
    special = np.tile(_special_values(dtype), 400)
    rng = np.random.default_rng(1)
    mixed = _kv_like(dtype).ravel().copy()
    mixed[rng.integers(0, mixed.size, 200)] = rng.choice(_special_values(dtype), 200)
    blocks = {
        "special": special.tobytes(),
        "all-equal": np.full(4096, _special_values(dtype)[6], np.uint16).tobytes(),
        "zeros": bytes(8192),
        "random": rng.integers(0, 256, 9001, dtype=np.uint8).tobytes(),
        "mixed": mixed.tobytes(),
    }
    for name, data in blocks.items():
        assert _round_trip(codec, data, dtype, SHAPE if name == "mixed" else ()) == data, name


def test_random_bytes_are_stored_raw():
    data = np.random.default_rng(2).integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
    for codec in CODED:
        header, stored = pack_block(NS, KEY, data, BlockMeta("bf16", (), codec))
        assert parse_header(header).meta.codec == "raw"
        assert stored.nbytes == len(data)


@pytest.mark.parametrize("codec", CODED)
def test_a_block_whose_first_bytes_do_not_shrink_is_declined_without_coding_the_rest(codec):
    """The probe decides: random first bytes, then bytes that would compress well, is raw."""
    head = np.random.default_rng(3).integers(0, 256, 1 << 14, dtype=np.uint8).tobytes()
    data = head + bytes(1 << 20)
    assert get_codec(codec).encode(memoryview(data), "fp8") is None
    assert get_codec(codec).encode(memoryview(bytes(len(data))), "fp8") is not None


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=3000),
    dtype=st.sampled_from(["bf16", "fp16", "fp8", "u8", "fp32"]),
    codec=st.sampled_from(CODED),
    dims=st.lists(st.integers(1, 9), min_size=0, max_size=4),
)
def test_any_bytes_with_any_shape_round_trip(data, dtype, codec, dims):
    assert _round_trip(codec, data, dtype, tuple(dims)) == data


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 40),
    channels=st.integers(1, 40),
    extra=st.integers(0, 200),
    seed=st.integers(0, 2**32 - 1),
)
def test_planes_split_and_merge_back_for_any_layout(tokens, channels, extra, seed):
    n = tokens * channels * 2 + extra
    raw = np.random.default_rng(seed).integers(0, 256, 2 * n, dtype=np.uint8)
    high, low = split_planes(memoryview(raw), tokens, channels)
    assert sorted(high) == sorted(raw[1::2]) and (low == raw[0::2]).all()
    out = np.zeros_like(raw)
    merge_planes(high, low, out, tokens, channels)
    assert (out == raw).all()


def test_channel_layout_uses_the_last_two_dims_only_when_the_shape_fits():
    assert channel_layout((2, 2, 3, 256, 64), 2 * 2 * 3 * 256 * 64) == (256, 64)
    assert channel_layout((2, 2, 3, 256, 64), 5) == (1, 1)
    assert channel_layout((64,), 64) == (1, 1)


def _stored(codec: str, dtype: str = "bf16", seed: int = 0) -> bytes | None:
    """The stored form of a KV-like block (None where the codec does not shrink it)."""
    data = _kv_like(dtype, seed).tobytes()
    out = get_codec(codec).encode(memoryview(data), dtype, SHAPE)
    return None if out is None else bytes(out)


@pytest.mark.parametrize("codec", CODED)
def test_truncated_stored_forms_are_corrupt(codec):
    stored = _stored(codec)
    out = bytearray(len(_kv_like("bf16").tobytes()))
    for keep in (0, 5, 39, 47, len(stored) // 2, len(stored) - 1):
        with pytest.raises(CorruptBlockError):
            get_codec(codec).decode_into(memoryview(stored[:keep]), memoryview(out), "bf16")


@pytest.mark.parametrize("codec", CODED)
def test_a_stored_form_larger_than_the_buffer_is_refused_before_decoding(codec):
    stored = _stored(codec)
    out = bytearray(100)
    with pytest.raises(CorruptBlockError, match="buffer"):
        get_codec(codec).decode_into(memoryview(stored), memoryview(out), "bf16")


def _damage(rng: np.random.Generator, good: bytes, near: int) -> bytes:
    """``good`` with 1-3 bytes changed (half the time within its first ``near`` bytes), and
    sometimes truncated."""
    bad = bytearray(good)
    for _ in range(int(rng.integers(1, 4))):
        at = int(rng.integers(0, min(len(bad), near) if rng.random() < 0.5 else len(bad)))
        bad[at] = int(rng.integers(0, 256))
    if rng.random() < 0.2:
        bad = bad[: int(rng.integers(0, len(bad)))]
    return bytes(bad)


def test_fuzzed_stored_forms_fail_typed_and_never_overrun():
    """Time-bounded: damaged codec payloads raise CorruptBlockError or decode within bounds."""
    rng = np.random.default_rng(7)
    size = len(_kv_like("bf16").tobytes())
    forms = [(c, d, f) for c in CODED for d in PLANE_DTYPES if (f := _stored(c, d)) is not None]
    deadline = time.monotonic() + 3.0
    tries = 0
    while time.monotonic() < deadline:
        codec, dtype, good = forms[tries % len(forms)]
        out = bytearray(size + 16)
        out[size:] = b"\x5a" * 16
        try:
            n = get_codec(codec).decode_into(
                memoryview(_damage(rng, good, 64)), memoryview(out)[:size], dtype
            )
        except CorruptBlockError:
            pass
        else:  # the damage hit bytes that decode anyway; the block checksum catches those
            assert 0 <= n <= size
        assert out[size:] == b"\x5a" * 16
        tries += 1
    assert tries > 50


def test_fuzzed_blocks_are_a_block_error_or_the_same_bytes():
    """Time-bounded: through the container a damaged block is never data."""
    rng = np.random.default_rng(8)
    blocks = []
    for codec in CODED:
        for dtype in PLANE_DTYPES:
            data = _kv_like(dtype, 4).tobytes()
            header, stored = pack_block(NS, KEY, data, BlockMeta(dtype, SHAPE, codec))
            blocks.append((data, header + bytes(stored)))
    deadline = time.monotonic() + 2.0
    tries = 0
    while time.monotonic() < deadline:
        data, good = blocks[tries % len(blocks)]
        out = bytearray(len(data))
        try:
            unpack_into(_damage(rng, good, 200), out, NS, KEY)
        except BlockError:
            pass
        else:
            assert bytes(out) == data
        tries += 1
    assert tries > 50
