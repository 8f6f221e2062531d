"""The block container: a round trip gives the bytes back; every kind of damage is a typed error."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvtier.codec import (
    HEADER_SIZE,
    BlockError,
    BlockHeader,
    BlockMeta,
    BufferTooSmallError,
    CorruptBlockError,
    ForeignBlockError,
    UnsupportedBlockError,
    pack_block,
    parse_header,
    unpack_into,
)
from kvtier.codec.codecs import get_codec
from kvtier.codec.container import MAGIC, VALUE_OFFSET, VERSION

NS = bytes(range(16))
OTHER_NS = bytes(range(1, 17))
KEY = b"k" * 16
SHAPE = (2, 2, 4, 8, 16)  # layers, k/v, kv heads, tokens, head dim

# offsets of header fields (see the struct layout in kvtier.codec.container)
_VERSION_AT = 4
_CODEC_AT = 6
_DTYPE_AT = 7
_RANK_AT = 8
_RAW_LEN_AT = 12 + 32
_STORED_LEN_AT = _RAW_LEN_AT + 8


def _payload(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**16, size=SHAPE, dtype=np.uint16)


def _block(payload: np.ndarray | None = None, meta: BlockMeta | None = None) -> bytearray:
    payload = _payload() if payload is None else payload
    meta = meta or BlockMeta("bf16", SHAPE)
    header, stored = pack_block(NS, KEY, payload, meta)
    assert len(header) == HEADER_SIZE
    return bytearray(header) + bytearray(stored)


def _patch(block: bytearray, at: int, fmt: str, value: int) -> bytearray:
    out = bytearray(block)
    struct.pack_into(fmt, out, at, value)
    return out


def test_round_trip_gives_the_same_bytes_and_meta():
    payload = _payload(1)
    block = _block(payload)
    out = np.zeros_like(payload)
    header = unpack_into(block, out, namespace=NS, key=KEY)
    assert np.array_equal(out, payload)
    assert header.meta == BlockMeta("bf16", SHAPE, "raw")
    assert header.raw_len == payload.nbytes == header.stored_len
    assert header.total_len == len(block)
    assert header.namespace == NS and header.key == KEY and header.version == VERSION
    assert parse_header(block) == header


def test_round_trip_into_a_larger_buffer_and_without_checksum():
    payload = _payload(2)
    block = _block(payload)
    out = bytearray(payload.nbytes + 100)
    unpack_into(memoryview(block), out, check=False)
    assert bytes(out[: payload.nbytes]) == payload.tobytes()
    assert bytes(out[payload.nbytes :]) == b"\x00" * 100


def test_empty_and_scalar_payloads_round_trip():
    header, stored = pack_block(NS, KEY, b"")
    block = header + bytes(stored)
    assert unpack_into(block, bytearray(0)).raw_len == 0
    assert parse_header(block).meta == BlockMeta()


def test_bad_magic_is_corrupt():
    block = _block()
    block[:4] = b"NOPE"
    with pytest.raises(CorruptBlockError, match="magic"):
        parse_header(block)
    assert MAGIC != b"NOPE"


def test_unknown_version_is_unsupported():
    block = _patch(_block(), _VERSION_AT, "<H", VERSION + 1)
    with pytest.raises(UnsupportedBlockError, match="version"):
        unpack_into(block, bytearray(len(block)))


def test_unknown_codec_is_unsupported():
    block = _patch(_block(), _CODEC_AT, "<B", 250)
    with pytest.raises(UnsupportedBlockError, match="codec"):
        parse_header(block)


@pytest.mark.parametrize(("at", "value"), [(_DTYPE_AT, 99), (_RANK_AT, 7)])
def test_impossible_dtype_or_rank_is_corrupt(at, value):
    with pytest.raises(CorruptBlockError):
        parse_header(_patch(_block(), at, "<B", value))


def test_block_of_another_namespace_or_key_is_foreign():
    block = _block()
    with pytest.raises(ForeignBlockError, match="namespace"):
        unpack_into(block, bytearray(len(block)), namespace=OTHER_NS, key=KEY)
    with pytest.raises(ForeignBlockError, match="key"):
        unpack_into(block, bytearray(len(block)), namespace=NS, key=b"x" * 16)


@pytest.mark.parametrize("at", [_RAW_LEN_AT, _STORED_LEN_AT])
def test_a_length_that_disagrees_with_the_payload_is_corrupt(at):
    block = _block()
    (value,) = struct.unpack_from("<Q", block, at)
    bad = _patch(block, at, "<Q", value - 8)
    with pytest.raises(CorruptBlockError):
        unpack_into(bad, bytearray(len(block)))


def test_a_flipped_payload_bit_fails_the_checksum():
    block = _block()
    block[HEADER_SIZE + 100] ^= 0x01
    with pytest.raises(CorruptBlockError, match="checksum"):
        unpack_into(block, bytearray(len(block)))


@pytest.mark.parametrize("at", [80, HEADER_SIZE - 20], ids=["shape", "padding"])
def test_a_flipped_header_bit_fails_the_checksum(at):
    block = _block()
    block[at] ^= 0x01
    with pytest.raises(CorruptBlockError, match="checksum"):
        unpack_into(block, bytearray(len(block)))


@pytest.mark.parametrize(
    ("at", "delta"), [(_RAW_LEN_AT, -8), (_RAW_LEN_AT, 8), (_STORED_LEN_AT, -8)]
)
def test_lying_lengths_are_caught_even_without_the_checksum(at, delta):
    payload = _payload()
    block = _block(payload)
    (value,) = struct.unpack_from("<Q", block, at)
    bad = _patch(block, at, "<Q", value + delta)
    with pytest.raises((CorruptBlockError, BufferTooSmallError)):
        unpack_into(bad, bytearray(payload.nbytes + 64), check=False)


@pytest.mark.parametrize("keep", [0, 10, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 7, -1])
def test_truncated_blocks_are_corrupt_with_or_without_the_checksum(keep):
    block = _block()
    cut = block[:keep]
    out = bytearray(len(block))
    with pytest.raises(CorruptBlockError, match="truncated"):
        unpack_into(cut, out)
    with pytest.raises(CorruptBlockError, match="truncated"):
        unpack_into(cut, out, check=False)


def test_a_too_small_buffer_is_the_callers_error_not_a_block_error():
    payload = _payload()
    with pytest.raises(BufferTooSmallError) as info:
        unpack_into(_block(payload), bytearray(payload.nbytes - 1))
    assert not isinstance(info.value, BlockError)


def test_every_block_error_is_one_family():
    for exc in (CorruptBlockError, ForeignBlockError, UnsupportedBlockError):
        assert issubclass(exc, BlockError)


def test_meta_refuses_unknown_dtypes_and_high_ranks():
    with pytest.raises(ValueError):
        BlockMeta("int3")
    with pytest.raises(ValueError):
        BlockMeta("u8", (1,) * 7)


def test_a_block_the_codec_cannot_shrink_is_known_raw_before_encoding():
    """stored_raw names ``raw`` for what the kv codec would decline anyway (random 16-bit words,
    opaque bytes) and keeps the codec for KV-like blocks and for codecs that cannot tell."""
    from kvtier.codec.container import stored_raw
    from kvtier.codec.planes import native

    rng = np.random.default_rng(3)
    shape = (2, 2, 3, 256, 64)
    noise = rng.integers(0, 256, int(np.prod(shape)) * 2, dtype=np.uint8)
    scale = np.exp2(rng.integers(-6, 3, size=(*shape[:-2], 1, shape[-1])))
    x = (rng.standard_normal(shape, dtype=np.float32) * scale).view(np.uint32) >> 16
    kv = x.astype(np.uint16).view(np.uint8).ravel()
    coded = BlockMeta("bf16", shape, "kv")
    assert stored_raw(kv, coded) is coded
    assert stored_raw(noise, BlockMeta("u8", (), "kv")).codec == "raw"
    assert stored_raw(noise, BlockMeta("bf16", shape, "zstd")).codec == "zstd"
    if native():
        assert stored_raw(noise, coded).codec == "raw"
        assert get_codec("kv").encode(memoryview(noise), "bf16", shape) is None


# --- digest kind 1: xxh3 over the header alone, the payload by its digest --------------------
def _digest_block(payload: bytes) -> tuple[bytes, BlockHeader]:
    from kvtier.codec.container import digest_header
    from kvtier.codec.digest import payload_digest

    meta = BlockMeta("bf16", (len(payload) // 2,))
    head = digest_header(NS, KEY, meta, len(payload), payload_digest(payload))
    header = parse_header(head, NS, KEY)
    assert header.digest == payload_digest(payload) and header.meta.codec == "raw"
    return head, header


def test_digest_kind_block_round_trips_and_verifies() -> None:
    from kvtier.codec.container import check_digest_header, verify, verify_parts

    payload = bytes(range(256)) * 32
    head, header = _digest_block(payload)
    assert header.digest is not None and header.stored_len == len(payload)
    verify(memoryview(head + payload), header)
    verify_parts(head, (payload[:1000], payload[1000:]), header)
    check_digest_header(memoryview(head), header)
    out = bytearray(len(payload))
    assert unpack_into(head + payload, out, NS, KEY).digest == header.digest
    assert bytes(out) == payload


def test_digest_kind_block_damage_is_caught() -> None:
    from kvtier.codec.container import check_digest_header, verify, verify_parts

    payload = bytes(range(256)) * 32
    head, header = _digest_block(payload)
    bad = bytearray(payload)
    bad[100] ^= 4
    with pytest.raises(CorruptBlockError, match="digest"):
        verify(memoryview(head + bytes(bad)), header)
    with pytest.raises(CorruptBlockError, match="digest"):
        verify_parts(head, (bytes(bad),), header)
    with pytest.raises(CorruptBlockError, match="truncated"):
        verify_parts(head, (payload[:-8],), header)
    worse = bytearray(head)
    worse[VALUE_OFFSET + 7] ^= 1  # the value field: only the header's own xxh3 covers it
    with pytest.raises(CorruptBlockError, match="header checksum"):
        check_digest_header(memoryview(bytes(worse)), parse_header(bytes(worse), NS, KEY))


def test_unknown_digest_kind_is_refused() -> None:
    from kvtier.codec.container import DIGEST_OFFSET

    head, _ = pack_block(NS, KEY, b"abcdefgh")
    odd = bytearray(head)
    odd[DIGEST_OFFSET + 8] = 7
    with pytest.raises(UnsupportedBlockError, match="digest kind"):
        parse_header(bytes(odd))


def test_blocks_without_a_digest_keep_kind_zero() -> None:
    head, _ = pack_block(NS, KEY, b"abcdefgh" * 8)
    assert parse_header(head).digest is None
