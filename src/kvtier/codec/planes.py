"""The ``kv`` codec: byte planes of 16-bit float KV, the high plane channel-major and coded with
one Huffman table per previous symbol.

A bf16 value's high byte is its sign and 7 of its 8 exponent bits, an fp16 value's its sign, 5
exponent bits and 2 mantissa bits; the low byte is mostly mantissa, close to random. The high
byte's distribution depends strongly on the channel (layer, K/V, head, head-dim index), and one
channel's values over a chunk's tokens share a scale, so a channel's next high byte is well
predicted by its previous one. The codec splits the two bytes of every element into two planes
and lays the high plane out channel-major — for a block of shape ``(..., tokens, channels)``
each channel's tokens become one contiguous run — then codes it order-1: each symbol with the
Huffman table of the symbol before it (for fp16, of its sign and top exponent bits), the tables
shared by the whole block and stored in it (:mod:`kvtier.codec._kvcore`, C). The low plane is
zstd level 1 only where that saves a real share of it, since decoding near-random bytes costs
more than it saves. Blocks of other dtypes (fp8, int8, fp32 …) and tiny blocks are one zstd
frame; opaque bytes (u8) are not KV and are stored as they are.

Stored form (little-endian): ``KP``, mode, flags (bit 0: high section coded, bit 1: low plane
zstd-coded), tokens and channels of the channel-major layout (u32 each), 4 zero bytes, raw
length, high and low section lengths (u64 each), then the high section, the low section and,
for an odd raw length, its last byte. Modes: 0, one zstd frame of the raw bytes; 1, 16-bit
planes each zstd level 1 (the high plane channel-major for bf16 only: what this codec writes
where its C part is not built); 2, 16-bit planes with the order-1 coded high plane (the section
format is in ``_kvcore.c``; it carries its own version). Every mode is read everywhere — mode 2
without the C part in Python, slowly — and every length is checked before it is used.
"""

from __future__ import annotations

import math
import struct
import threading
from typing import ClassVar

import numpy as np

from kvtier.codec.errors import CorruptBlockError
from kvtier.codec.parallel import spare_core
from kvtier.codec.zstd_frames import (
    flat_bytes,
    gains,
    head_declines,
    shrinks,
    zstd_compress,
    zstd_decompress,
)

try:  # the split/merge and order-1 coder in C (src/kvtier/codec/_kvcore.c), built with the package
    from kvtier.codec import _kvcore
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _kvcore = None

_HEAD = struct.Struct("<2sBBIIIQQQ")
MAGIC = b"KP"
MODE_BYTES = 0
MODE_PLANES = 1
MODE_O1 = 2
HIGH_CODED = 1
LOW_CODED = 2
#: The dtype of bytes that are not typed KV: stored as they are (``zstd`` codes any bytes).
OPAQUE_DTYPE = "u8"
#: dtypes split into two byte planes.
PLANE_DTYPES = ("bf16", "fp16")
#: dtypes whose high plane mode 1 lays out channel-major: bf16, whose high byte is sign and
#: exponent only (zstd codes fp16's high plane a little better in token order). Mode 2 lays
#: out both channel-major: its order-1 model wants a channel's values one after another.
CHANNEL_DTYPES = ("bf16",)
#: Mode 2's context: the previous high byte shifted right by this. fp16 keeps only its sign and
#: top three exponent bits: its high byte has more bits of entropy, so each table look-up
#: decodes fewer symbols, and fewer, cache-resident tables decode faster for a little ratio.
O1_SHIFT = {"bf16": 0, "fp16": 4}
#: Mode 2's longest code. bf16's high byte takes few bits a symbol, so codes of at most 9 bits
#: cost it little ratio and let the decoder's tables stay in the fastest cache; fp16's takes
#: more, and shorter codes would cost it more than they speed up.
O1_MAXBITS = {"bf16": 9, "fp16": 11}
#: A plane is stored coded only when that saves at least this share of its bytes.
PLANE_MIN_GAIN = 1 / 128
#: Mode 2 zstd-codes the low plane only when that (and first a sample spread over the plane)
#: saves this share of it.
LOW_MIN_GAIN = 1 / 32
#: Bytes of a plane tried first; a high-plane sample that does not shrink to
#: ``PROBE_MAX_SHARE`` of its size means the block is not KV-like and is left raw.
PROBE_BYTES = 64 * 1024
PROBE_MAX_SHARE = 0.9
#: High bytes (in token order) whose collision entropy mode 2 estimates before it splits a block
#: at all: above ``8 * PROBE_MAX_SHARE`` bits a symbol the block is not KV-like (random bytes
#: come out near 8, KV's sign-and-exponent bytes well below). The estimate is at most the
#: order-0 entropy, which bounds the order-1 code from above, and costs a small fraction of an
#: order-1 trial.
QUICK_PROBE = 4 * 1024
LEVEL = 1
#: The page size a stored form is aligned to.
PAGE = 4096
#: Largest plane a thread keeps its split buffers for between blocks.
SCRATCH_KEEP = 64 << 20
#: Smallest plane (symbols) whose block encodes and decodes on two threads where a core is
#: spare: below it, starting the second thread costs a real share of what it saves.
PARALLEL_PLANE = 1 << 20


def native() -> bool:
    """Whether the C part of the codec (``kvtier.codec._kvcore``) is built."""
    return _kvcore is not None


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
    if _kvcore is not None:
        high, low = np.empty(n, np.uint8), np.empty(n, np.uint8)
        _kvcore.split(raw, high, low, tokens, channels)
        return high, low
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
    if _kvcore is not None:
        _kvcore.merge(memoryview(high)[:n], memoryview(low)[:n], out, tokens, channels)
        return
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


def _entropy_bits(raw: memoryview) -> float:
    """Collision entropy (bits a symbol) of the first ``QUICK_PROBE`` high bytes of 16-bit
    words: ``-log2`` of the chance that two of them are equal, at most their order-0 entropy."""
    if _kvcore is not None:
        return _kvcore.high_entropy(raw, QUICK_PROBE)
    sample = np.frombuffer(raw, np.uint8, 2 * QUICK_PROBE)[1::2]
    counts = np.bincount(sample, minlength=256).astype(np.float64)
    return float(-np.log2((counts * counts).sum() / float(sample.size) ** 2))


def _threads(n: int) -> int:
    """Threads the C part encodes or decodes one block of ``n``-symbol planes on: two (half the
    split or merge and half the high section's streams each) for a large block where a second
    core is free."""
    return 2 if n >= PARALLEL_PLANE and spare_core() else 1


def _page_aligned(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` starting on a 4 KiB page."""
    base = np.empty(nbytes + PAGE, np.uint8)
    start = -base.ctypes.data % PAGE
    return base[start : start + nbytes]


def _code(plane) -> tuple[bytes | memoryview, bool]:
    """A plane's stored section and whether it is zstd-coded (only when that gains)."""
    view = memoryview(plane).cast("B")
    frame = zstd_compress(view, LEVEL)
    if len(frame) <= view.nbytes * (1 - PLANE_MIN_GAIN):
        return frame, True
    return view, False


class PlaneCodec:
    """Byte-plane codec for BF16/FP16 KV blocks (see the module docstring for the format).

    ``use_native`` (default: where it is built) chooses the C part; without it the codec
    writes mode 1 and reads mode 2 in Python.
    """

    name: ClassVar[str] = "kv"
    id: ClassVar[int] = 2

    def __init__(self, use_native: bool | None = None) -> None:
        if use_native and _kvcore is None:
            raise RuntimeError("the kv codec's C part (kvtier.codec._kvcore) is not built")
        self.use_native = _kvcore is not None if use_native is None else use_native
        self._scratch = threading.local()

    def declines(self, raw: memoryview, dtype: str) -> bool:
        """Whether ``raw`` is known not to gain before any encoding (opaque bytes; a 16-bit
        block whose high bytes look random): such a block is stored raw, and a tier can write
        it on its raw path."""
        if dtype == OPAQUE_DTYPE:
            return True
        if dtype not in PLANE_DTYPES or not self.use_native:
            return False
        raw = flat_bytes(raw)
        return raw.nbytes // 2 > 4 * QUICK_PROBE and _entropy_bits(raw) > 8 * PROBE_MAX_SHARE

    def encode(
        self, raw: memoryview, dtype: str, shape: tuple[int, ...] = ()
    ) -> bytes | memoryview | None:
        """The stored form, or None when the block does not shrink (the caller stores it raw)."""
        raw = flat_bytes(raw)
        size = raw.nbytes
        if dtype == OPAQUE_DTYPE:
            return None
        if dtype not in PLANE_DTYPES or size < 4:
            if head_declines(raw, LEVEL):
                return None
            frame = zstd_compress(raw, LEVEL)
            if not gains(_HEAD.size + len(frame), size):
                return None
            return _HEAD.pack(MAGIC, MODE_BYTES, HIGH_CODED, 1, 1, 0, size, len(frame), 0) + frame
        if self.use_native:
            return self._encode_o1(raw, dtype, shape)
        return self._encode_zstd_planes(raw, dtype, shape)

    def _encode_o1(self, raw: memoryview, dtype: str, shape: tuple[int, ...]) -> memoryview | None:
        size = raw.nbytes
        n = size // 2
        shift = O1_SHIFT[dtype]
        if self.declines(raw, dtype):
            return None  # not KV-like (random bytes…): known before the whole split
        tokens, channels = channel_layout(tuple(shape), n)
        high, low = self._planes(n)
        threads = _threads(n)
        _kvcore.split(raw, high, low, tokens, channels, threads)
        probe = high[:PROBE_BYTES]
        maxbits = O1_MAXBITS[dtype]
        sample = _kvcore.o1_encode(probe, shift, maxbits)
        if sample is None or len(sample) > PROBE_MAX_SHARE * probe.size:
            return None
        # the stored form is written in place: the high section straight after the header (it
        # is kept only where it fits in the room that saves PLANE_MIN_GAIN), then the low plane;
        # it starts on a page, so a tier writing with O_DIRECT needs no aligned copy of it
        out = _page_aligned(_HEAD.size + 2 * n + size % 2)
        at = _HEAD.size
        room = int(n * (1 - PLANE_MIN_GAIN))
        hi_len = _kvcore.o1_encode_into(high, shift, maxbits, out[at : at + room], threads)
        hi_coded = hi_len > 0
        if not hi_coded:
            out[at : at + n] = high
            hi_len = n
        at += hi_len
        lo_coded = False
        lo_len = n
        sample = np.ascontiguousarray(low[:: max(1, n // PROBE_BYTES)])
        if len(zstd_compress(sample, LEVEL)) <= sample.size * (1 - LOW_MIN_GAIN):
            frame = zstd_compress(low, LEVEL)
            if len(frame) <= n * (1 - LOW_MIN_GAIN):
                lo_len, lo_coded = len(frame), True
                out[at : at + lo_len] = np.frombuffer(frame, np.uint8)
        if not lo_coded:
            out[at : at + n] = low
        at += lo_len
        if size % 2:
            out[at] = raw[2 * n]
            at += 1
        if not gains(at, size):
            return None
        flags = (HIGH_CODED if hi_coded else 0) | (LOW_CODED if lo_coded else 0)
        _HEAD.pack_into(out, 0, MAGIC, MODE_O1, flags, tokens, channels, 0, size, hi_len, lo_len)
        return memoryview(out[:at])

    def _planes(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """This thread's two plane buffers of ``n`` bytes, kept between blocks (a fresh pair
        of large arrays would be fresh pages: their faults cost as much as the split)."""
        if n > SCRATCH_KEEP:
            return np.empty(n, np.uint8), np.empty(n, np.uint8)
        kept = getattr(self._scratch, "planes", None)
        if kept is None or kept.shape[1] < n:
            kept = self._scratch.planes = np.empty((2, n), np.uint8)
        return kept[0, :n], kept[1, :n]

    def _encode_zstd_planes(
        self, raw: memoryview, dtype: str, shape: tuple[int, ...]
    ) -> bytes | None:
        size = raw.nbytes
        n = size // 2
        probe = np.frombuffer(raw, np.uint8, 2 * min(n, PROBE_BYTES))[1::2]
        if not shrinks(probe.tobytes()):
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
        stored = flat_bytes(stored)
        if stored.nbytes < _HEAD.size:
            raise CorruptBlockError(f"kv payload of {stored.nbytes} bytes is truncated")
        magic, mode, flags, tokens, channels, zero, size, hi_len, lo_len = _HEAD.unpack_from(stored)
        if magic != MAGIC or zero or flags > HIGH_CODED | LOW_CODED or mode > MODE_O1:
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
        high_raw = mode == MODE_PLANES or not flags & HIGH_CODED
        if (
            tokens == 0
            or channels == 0
            or hi_len + lo_len + size % 2 != body.nbytes
            or (not flags & HIGH_CODED and hi_len != n)
            or (not flags & LOW_CODED and lo_len != n)
        ):
            raise CorruptBlockError("kv payload lengths do not match its size")
        hi_sec, lo_sec = body[:hi_len], body[hi_len : hi_len + lo_len]
        low = zstd_decompress(lo_sec, n) if flags & LOW_CODED else lo_sec
        if mode == MODE_PLANES and flags & HIGH_CODED:
            hi_sec = memoryview(zstd_decompress(hi_sec, n))
        if high_raw or (self.use_native and _kvcore is not None):
            if _kvcore is not None:
                try:
                    _kvcore.decode_planes(
                        hi_sec, not high_raw, low, out[: 2 * n], tokens, channels, _threads(n)
                    )
                except ValueError as exc:
                    raise CorruptBlockError(f"kv payload does not decode: {exc}") from None
            else:
                merge_planes(hi_sec, low, target[: 2 * n], tokens, channels)
        else:
            merge_planes(o1_decode_py(hi_sec, n), low, target[: 2 * n], tokens, channels)
        if size % 2:
            target[-1] = body[-1]
        return size


# --- mode 2's high section in Python (where the C part is not built; a test reference) -------
_O1_VERSION, _O1_STREAMS, _O1_START = 1, 8, 256
#: the longest code lengths a section may declare (the C decoder has tables for these)
_O1_WINDOWS = (9, 11)


def _canonical(lens: dict[int, int], maxbits: int) -> dict[tuple[int, int], int]:
    """(length, MSB-first code) → symbol of canonical code lengths (DEFLATE's assignment)."""
    count = [0] * (maxbits + 1)
    for length in lens.values():
        count[length] += 1
    if sum(count[ln] << (maxbits - ln) for ln in range(1, maxbits + 1)) > (1 << maxbits):
        raise CorruptBlockError("kv payload does not decode: a code table is not valid")
    code, nxt = 0, [0] * (maxbits + 1)
    for ln in range(1, maxbits + 1):
        code = (code + count[ln - 1]) << 1
        nxt[ln] = code
    out = {}
    for sym in sorted(lens):
        out[(lens[sym], nxt[lens[sym]])] = sym
        nxt[lens[sym]] += 1
    return out


def o1_decode_py(section, n: int) -> np.ndarray:
    """The ``n`` symbols of a mode-2 high section, decoded in Python (see ``_kvcore.c``)."""
    b = bytes(section)

    def bad(why: str) -> CorruptBlockError:
        return CorruptBlockError(f"kv payload does not decode: {why}")

    if len(b) < 45:
        raise bad("section truncated")
    if b[0] != _O1_VERSION or b[1] not in _O1_WINDOWS or b[2] != _O1_STREAMS or b[3] > 7:
        raise bad("section header is not valid")
    maxbits = b[1]
    shift, count, ctxmap = b[3], int.from_bytes(b[4:12], "little"), b[12:45]
    if count != n:
        raise bad("section holds another number of symbols")
    if ctxmap[32] & 0xFE:
        raise bad("section header is not valid")
    table_of, ntab = [], 1
    for c in range(257):
        own = (ctxmap[c >> 3] >> (c & 7)) & 1
        table_of.append(ntab if own else 0)
        ntab += own
    p, tables = 45, []
    for _ in range(ntab):
        if len(b) - p < 32:
            raise bad("section truncated")
        bitmap = b[p : p + 32]
        p += 32
        syms = [s for s in range(256) if (bitmap[s >> 3] >> (s & 7)) & 1]
        if len(b) - p < (len(syms) + 1) // 2:
            raise bad("section truncated")
        lens = {}
        for i, s in enumerate(syms):
            nib = b[p + i // 2] >> (4 * (i % 2)) & 15
            if nib == 0 or nib > maxbits:
                raise bad("a code table is not valid")
            lens[s] = nib
        p += (len(syms) + 1) // 2
        tables.append(_canonical(lens, maxbits))
    if len(b) - p < 4 * _O1_STREAMS:
        raise bad("section truncated")
    lengths = struct.unpack_from(f"<{_O1_STREAMS}I", b, p)
    p += 4 * _O1_STREAMS
    if sum(lengths) != len(b) - p:
        raise bad("stream lengths do not match the section")
    out = np.empty(n, np.uint8)
    for i, length in enumerate(lengths):
        lo, hi = n * i // _O1_STREAMS, n * (i + 1) // _O1_STREAMS
        bits = np.unpackbits(np.frombuffer(b, np.uint8, length, p), bitorder="little").tolist()
        p += length
        pos, table = 0, tables[table_of[_O1_START]]
        for k in range(lo, hi):
            code, ln = 0, 0
            while True:
                if ln == maxbits or pos >= len(bits):
                    raise bad("a stream does not decode to its length")
                code, ln, pos = code << 1 | bits[pos], ln + 1, pos + 1
                sym = table.get((ln, code))
                if sym is not None:
                    break
            out[k] = sym
            table = tables[table_of[sym >> shift]]
        if (pos + 7) // 8 != length:
            raise bad("a stream does not decode to its length")
    return out


__all__ = [
    "PLANE_DTYPES",
    "PlaneCodec",
    "channel_layout",
    "merge_planes",
    "native",
    "o1_decode_py",
    "split_planes",
]
