"""The kv codec's stored modes: what the C part writes (mode 2), what the codec writes without it
(mode 1) and old mode-1 blocks are all read, with or without the C part, bit-exact; a mode this
kvtier does not know is a CorruptBlockError; blocks decode concurrently."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvtier.codec.errors import CorruptBlockError
from kvtier.codec.parallel import Decoders
from kvtier.codec.planes import _HEAD, MODE_O1, MODE_PLANES, PARALLEL_PLANE, PlaneCodec

SHAPE = (2, 2, 3, 32, 16)


def _block(dtype: str, seed: int = 0, shape=SHAPE) -> bytes:
    """KV-like values (per-channel scales, smooth over tokens) with special values mixed in."""
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-6, 4, size=(*shape[:-2], 1, shape[-1])))
    walk = np.cumsum(rng.standard_normal(shape) * 0.2, axis=-2)
    x = (rng.standard_normal(shape) + walk) * scale
    if dtype == "fp16":
        bits = x.astype(np.float16).view(np.uint16)
        special = [0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001, 0x83FF, 0x7E01, 0x7C01]
    else:
        bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        special = [0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F, 0x7FC1, 0x7F81]
    flat = bits.ravel()
    flat[rng.integers(0, flat.size, 64)] = rng.choice(special, 64)
    return flat.tobytes()


def _mode(stored: bytes) -> int:
    return _HEAD.unpack_from(stored)[1]


def _decode(codec: PlaneCodec, stored: bytes, size: int, dtype: str) -> bytes:
    out = bytearray(size + 5)
    out[size:] = b"\xee" * 5
    assert codec.decode_into(memoryview(stored), memoryview(out)[:size], dtype) == size
    assert out[size:] == b"\xee" * 5
    return bytes(out[:size])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("odd", [0, 1])
def test_every_mode_is_read_with_and_without_the_c_part(dtype, odd):
    data = _block(dtype) + b"\x07" * odd
    fast, plain = PlaneCodec(), PlaneCodec(use_native=False)
    mode2 = fast.encode(memoryview(data), dtype, SHAPE)
    mode1 = plain.encode(memoryview(data), dtype, SHAPE)
    assert (_mode(mode2), _mode(mode1)) == (MODE_O1, MODE_PLANES)
    for reader in (fast, plain):
        for stored in (mode2, mode1):
            assert _decode(reader, stored, len(data), dtype) == data


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_blocks_without_a_usable_shape_and_tiny_blocks_round_trip(dtype):
    codec = PlaneCodec()
    for data, shape in (
        (_block(dtype), ()),  # no shape: the plane is one token-order run
        (_block(dtype), (7, 5)),  # a shape that does not describe the block
        (_block(dtype, shape=(1, 1, 1, 3, 16)), (1, 1, 1, 3, 16)),
        (b"\x01\x3f\x02\x3f\x03", (2,)),
    ):
        stored = codec.encode(memoryview(data), dtype, shape)
        if stored is not None:
            assert _decode(codec, stored, len(data), dtype) == data


def test_an_unknown_mode_is_corrupt():
    data = _block("bf16")
    stored = bytearray(PlaneCodec().encode(memoryview(data), "bf16", SHAPE))
    stored[2] = MODE_O1 + 1
    with pytest.raises(CorruptBlockError, match="header"):
        PlaneCodec().decode_into(memoryview(bytes(stored)), memoryview(bytearray(len(data))), "")


def test_a_damaged_high_section_is_corrupt_not_data():
    data = _block("bf16")
    stored = bytearray(PlaneCodec().encode(memoryview(data), "bf16", SHAPE))
    stored[_HEAD.size] ^= 0xFF  # the section's version byte
    for codec in (PlaneCodec(), PlaneCodec(use_native=False)):
        with pytest.raises(CorruptBlockError):
            codec.decode_into(memoryview(bytes(stored)), memoryview(bytearray(len(data))), "bf16")


def test_blocks_decode_exactly_on_several_threads_at_once():
    """The C part keeps scratch memory per thread and releases the GIL: blocks decoded
    concurrently come back exact."""
    codec = PlaneCodec()
    blocks = [_block("bf16", seed) for seed in range(8)]
    stored = [codec.encode(memoryview(b), "bf16", SHAPE) for b in blocks]

    def decode(k: int) -> bool:
        return all(_decode(codec, stored[k], len(blocks[k]), "bf16") == blocks[k] for _ in range(5))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(decode, range(len(blocks))))


def test_a_large_block_codes_exactly_on_its_own_thread_and_on_a_codec_thread():
    """A block of at least PARALLEL_PLANE symbols splits its encode and decode over two threads
    where the caller has a core to spare (not on the pool's threads): the same bytes either way,
    and a damaged one is corrupt on both paths."""
    shape = (8, 2, 4, 256, 64)  # a million bf16 values
    data = _block("bf16", 5, shape)
    assert len(data) // 2 >= PARALLEL_PLANE  # symbols in each plane
    codec = PlaneCodec()
    stored = bytes(codec.encode(memoryview(data), "bf16", shape))
    assert _mode(stored) == MODE_O1
    pool = Decoders(threads=2)
    try:  # encoded on two threads here and on one there: the same stored form
        there = pool.submit(codec.encode, memoryview(data), "bf16", shape).result()
        assert bytes(there) == stored
        assert _decode(codec, stored, len(data), "bf16") == data
        assert pool.submit(_decode, codec, stored, len(data), "bf16").result() == data
        bad = bytearray(stored)
        bad[_HEAD.size + len(bad) // 8] ^= 0x5A  # inside the high section's streams
        for run in (lambda f, *a: f(*a), lambda f, *a: pool.submit(f, *a).result()):
            with contextlib.suppress(CorruptBlockError):  # or decodes to other bytes
                assert run(_decode, codec, bytes(bad), len(data), "bf16") != data
    finally:
        pool.close()


def test_blocks_encode_exactly_on_several_threads_at_once_onto_whole_pages():
    """Each thread splits into planes of its own, kept between blocks: blocks of two sizes
    encoded concurrently come back exact, each stored form starting on a page (what a tier
    writing with O_DIRECT writes from without an aligned copy)."""
    codec = PlaneCodec()
    shapes = [SHAPE, (2, 2, 3, 64, 16)]
    blocks = [(_block("bf16", seed, shapes[seed % 2]), shapes[seed % 2]) for seed in range(12)]

    def encode(k: int) -> bool:
        data, shape = blocks[k]
        ok = True
        for _ in range(4):
            stored = codec.encode(memoryview(data), "bf16", shape)
            view = np.frombuffer(stored, np.uint8)
            ok &= view.ctypes.data % 4096 == 0 and _mode(stored) == MODE_O1
            ok &= _decode(codec, stored, len(data), "bf16") == data
        return bool(ok)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(encode, range(len(blocks))))
