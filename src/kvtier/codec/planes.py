"""The ``kv`` codec: byte planes of 16-bit float KV, the high plane channel-major, zstd-coded.

A bf16 value's high byte is its sign and 7 of its 8 exponent bits, an fp16 value's its sign, 5
exponent bits and 2 mantissa bits; the low byte is mostly mantissa, close to random. The high
byte's distribution depends strongly on the channel (layer, K/V, head, head-dim index): one
channel's values over a chunk's tokens share a scale. So the codec splits the two bytes of every
element into two planes and lays the high plane out channel-major — for a block of shape
``(..., tokens, channels)`` each channel's tokens become one contiguous run — which lets zstd's
matches and its per-block Huffman tables follow each channel's exponents. Each plane is zstd
level 1 or, when that does not gain, stored as is. The channel step is for bf16 only (see
:data:`CHANNEL_DTYPES`). Blocks of other dtypes (fp8, int8, fp32 …)
and blocks without a usable shape are coded the same way without the channel step (fp8: one
zstd frame of the bytes); opaque bytes (u8) are not KV and are stored as they are.

Stored form (little-endian): ``KP``, mode (0: one zstd frame of the raw bytes; 1: 16-bit
planes), flags (bit 0: high plane zstd-coded, bit 1: low plane zstd-coded), tokens and channels
of the channel-major layout (u32 each), 4 zero bytes, raw length, high and low section lengths
(u64 each), then the high section, the low section and, for an odd raw length, its last byte.
Everything a decoder needs is in these bytes; every length is checked before it is used.
"""

from __future__ import annotations

import math
import struct
from typing import ClassVar

import numpy as np

from kvtier.codec.errors import CorruptBlockError
from kvtier.codec.zstd_frames import gains, zstd_compress, zstd_decompress

_HEAD = struct.Struct("<2sBBIIIQQQ")
MAGIC = b"KP"
MODE_BYTES = 0
MODE_PLANES = 1
HIGH_CODED = 1
LOW_CODED = 2
#: The dtype of bytes that are not typed KV: stored as they are (``zstd`` codes any bytes).
OPAQUE_DTYPE = "u8"
#: dtypes split into two byte planes.
PLANE_DTYPES = ("bf16", "fp16")
#: dtypes whose high plane is laid out channel-major: bf16, whose high byte is sign and
#: exponent only. fp16's high byte holds 2 mantissa bits too, and on real fp16 KV zstd codes
#: its plane a little better in token order.
CHANNEL_DTYPES = ("bf16",)
#: A plane is stored zstd-coded only when that saves at least this share of its bytes.
PLANE_MIN_GAIN = 1 / 128
#: Bytes of the high plane zstd tries first; a sample that does not shrink to
#: ``PROBE_MAX_SHARE`` of its size means the block is not KV-like and is left raw.
PROBE_BYTES = 64 * 1024
PROBE_MAX_SHARE = 0.9
#: Bytes zstd tries first of a block without planes (fp8, u8…), likewise.
BYTES_PROBE = 4 * 1024
LEVEL = 1


def channel_layout(shape: tuple[int, ...], elements: int) -> tuple[int, int]:
    """(tokens, channels) of the channel-major step for a block of ``shape`` holding
    ``elements`` 16-bit values: its last two dimensions, or (1, 1) when the shape does not
    describe the block."""
    if len(shape) >= 2 and math.prod(shape) == elements and shape[-1] > 0 and shape[-2] > 0:
        return int(shape[-2]), int(shape[-1])
    return 1, 1


def split_planes(raw: memoryview, tokens: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """The high plane (channel-major within each tokens×channels group) and the low plane."""
    n = raw.nbytes // 2
    pairs = np.frombuffer(raw, np.uint8, 2 * n).reshape(n, 2)
    group = tokens * channels
    g = n // group
    m = g * group
    high = np.empty(n, np.uint8)
    if g:
        src = pairs[:m, 1].reshape(g, tokens, channels).transpose(0, 2, 1)
        np.copyto(high[:m].reshape(g, channels, tokens), src)
    high[m:] = pairs[m:, 1]
    low = np.ascontiguousarray(pairs[:, 0])
    return high, low


def merge_planes(high, low, out: np.ndarray, tokens: int, channels: int) -> None:
    """Inverse of :func:`split_planes`: interleave the planes into ``out`` (uint8, 2·n bytes)."""
    n = out.size // 2
    pairs = out.reshape(n, 2)
    hi = np.frombuffer(high, np.uint8, n)
    group = tokens * channels
    g = n // group
    m = g * group
    if g:
        dst = pairs[:m, 1].reshape(g, tokens, channels)
        np.copyto(dst, hi[:m].reshape(g, channels, tokens).transpose(0, 2, 1))
    pairs[m:, 1] = hi[m:]
    pairs[:, 0] = np.frombuffer(low, np.uint8, n)


def _shrinks(sample) -> bool:
    """Whether zstd shrinks ``sample`` to at most :data:`PROBE_MAX_SHARE` of its size."""
    return len(zstd_compress(sample, LEVEL)) <= PROBE_MAX_SHARE * len(memoryview(sample))


def _code(plane) -> tuple[bytes | memoryview, bool]:
    """A plane's stored section and whether it is zstd-coded (only when that gains)."""
    view = memoryview(plane).cast("B")
    frame = zstd_compress(view, LEVEL)
    if len(frame) <= view.nbytes * (1 - PLANE_MIN_GAIN):
        return frame, True
    return view, False


class PlaneCodec:
    """Byte-plane codec for BF16/FP16 KV blocks (see the module docstring for the format)."""

    name: ClassVar[str] = "kv"
    id: ClassVar[int] = 2

    def encode(self, raw: memoryview, dtype: str, shape: tuple[int, ...] = ()) -> bytes | None:
        """The stored form, or None when the block does not shrink (the caller stores it raw)."""
        raw = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
        size = raw.nbytes
        if dtype == OPAQUE_DTYPE:
            return None
        if dtype not in PLANE_DTYPES or size < 4:
            if size > 2 * BYTES_PROBE and not _shrinks(raw[:BYTES_PROBE]):
                return None
            frame = zstd_compress(raw, LEVEL)
            if not gains(_HEAD.size + len(frame), size):
                return None
            return _HEAD.pack(MAGIC, MODE_BYTES, HIGH_CODED, 1, 1, 0, size, len(frame), 0) + frame
        n = size // 2
        probe = np.frombuffer(raw, np.uint8, 2 * min(n, PROBE_BYTES))[1::2]
        if not _shrinks(probe.tobytes()):
            return None
        tokens, channels = channel_layout(tuple(shape), n) if dtype in CHANNEL_DTYPES else (1, 1)
        high, low = split_planes(raw, tokens, channels)
        hi_sec, hi_coded = _code(high)
        lo_sec, lo_coded = _code(low)
        flags = (HIGH_CODED if hi_coded else 0) | (LOW_CODED if lo_coded else 0)
        head = _HEAD.pack(
            MAGIC, MODE_PLANES, flags, tokens, channels, 0, size, len(hi_sec), len(lo_sec)
        )
        if not gains(len(head) + len(hi_sec) + len(lo_sec) + size % 2, size):
            return None
        return b"".join((head, hi_sec, lo_sec, raw[2 * n :]))

    def decode_into(self, stored: memoryview, out: memoryview, dtype: str) -> int:
        """Decode into ``out``; CorruptBlockError for anything that is not a whole, valid form."""
        stored = stored.cast("B") if stored.format != "B" or stored.ndim != 1 else stored
        if stored.nbytes < _HEAD.size:
            raise CorruptBlockError(f"kv payload of {stored.nbytes} bytes is truncated")
        magic, mode, flags, tokens, channels, zero, size, hi_len, lo_len = _HEAD.unpack_from(stored)
        if magic != MAGIC or zero or flags > HIGH_CODED | LOW_CODED or mode > MODE_PLANES:
            raise CorruptBlockError("kv payload header is not valid")
        if size > out.nbytes:
            raise CorruptBlockError(f"kv payload says {size} bytes, the buffer holds {out.nbytes}")
        body = stored[_HEAD.size :]
        target = np.frombuffer(out, np.uint8, size) if size else np.empty(0, np.uint8)
        if mode == MODE_BYTES:
            if lo_len or flags != HIGH_CODED or hi_len != body.nbytes:
                raise CorruptBlockError("kv payload lengths do not match its size")
            target[:] = np.frombuffer(zstd_decompress(body, size), np.uint8)
            return size
        n = size // 2
        if (
            tokens == 0
            or channels == 0
            or hi_len + lo_len + size % 2 != body.nbytes
            or (not flags & HIGH_CODED and hi_len != n)
            or (not flags & LOW_CODED and lo_len != n)
        ):
            raise CorruptBlockError("kv payload lengths do not match its size")
        hi_sec, lo_sec = body[:hi_len], body[hi_len : hi_len + lo_len]
        high = zstd_decompress(hi_sec, n) if flags & HIGH_CODED else hi_sec
        low = zstd_decompress(lo_sec, n) if flags & LOW_CODED else lo_sec
        merge_planes(high, low, target[: 2 * n], tokens, channels)
        if size % 2:
            target[-1] = body[-1]
        return size


__all__ = ["PLANE_DTYPES", "PlaneCodec", "channel_layout", "merge_planes", "split_planes"]
