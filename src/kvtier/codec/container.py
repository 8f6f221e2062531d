"""The stored block: a fixed 128-byte little-endian header, then the (possibly encoded) payload.

Header: magic ``KVTB``, format version, codec id, dtype code, rank, namespace id (16 B), key (16 B),
raw length, stored length, xxh3-64 checksum over the header (checksum field zeroed) and the
payload, up to six shape dimensions, and the block's value (f64 seconds of prefill it saves, an
eviction hint); then, in what was zero padding, a payload digest and its kind. A block of digest
kind 1 (written straight from GPU memory) has its xxh3 over the header alone and its payload
covered by the digest (``kvtier.codec.digest``), which the device that reads it can compute.
No pickle: every field is a fixed-width number.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from kvtier.codec.codecs import CODECS, RawCodec, get_codec
from kvtier.codec.digest import payload_digest
from kvtier.codec.errors import (  # the errors are re-exported from here too
    BlockError,  # noqa: F401
    BufferTooSmallError,
    CorruptBlockError,
    ForeignBlockError,
    UnsupportedBlockError,
)

MAGIC = b"KVTB"
VERSION = 1
HEADER_SIZE = 128
MAX_RANK = 6
_FMT = struct.Struct("<4sHBBB3x16s16sQQQ6Id")
CHECKSUM_OFFSET = 4 + 2 + 1 + 1 + 1 + 3 + 16 + 16 + 8 + 8
_PAD = b"\x00" * (HEADER_SIZE - _FMT.size)
#: The payload digest (8 bytes) and its kind (1 byte) after the fixed fields: kind 0 (zero
#: padding, every block of earlier versions) has no digest and the xxh3 covers the payload.
_DIGEST = struct.Struct("<QB")
DIGEST_OFFSET = _FMT.size
DIGEST_KIND = 1
_DIGEST_PAD = b"\x00" * (HEADER_SIZE - _FMT.size - _DIGEST.size)
#: Where the header's fields sit, for code that builds headers from a template (the file tiers'
#: ring batches): the key, then raw and stored lengths, then the checksum (8 bytes, zero while
#: it is computed), the shape, and the block's value (f64) last before the zero padding.
KEY_OFFSET = CHECKSUM_OFFSET - 32
VALUE_OFFSET = _FMT.size - 8
DTYPES = {"u8": 0, "bf16": 1, "fp16": 2, "fp32": 3, "fp8": 4, "int8": 5}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class BlockMeta:
    """What the bytes of a payload are: element dtype, shape, and the codec to store them with.

    ``value`` is a hint, not identity: the seconds of prefill the block saves when reused. It
    travels in the header so cost-aware eviction keeps it across tiers, promotions and restarts.
    """

    dtype: str = "u8"
    shape: tuple[int, ...] = ()
    codec: str = "raw"
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown block dtype {self.dtype!r}; use one of {sorted(DTYPES)}")
        if len(self.shape) > MAX_RANK:
            raise ValueError(f"block shape {self.shape} has more than {MAX_RANK} dimensions")
        if not self.value >= 0.0:
            raise ValueError(
                f"block value must be a non-negative number of seconds, not {self.value}"
            )

    def with_codec(self, codec: str) -> BlockMeta:
        """The same meta naming ``codec`` (fields already checked: no second validation)."""
        if codec == self.codec:
            return self
        out = object.__new__(BlockMeta)
        for name, value in (
            ("dtype", self.dtype),
            ("shape", self.shape),
            ("codec", codec),
            ("value", self.value),
        ):
            object.__setattr__(out, name, value)
        return out


RAW_META = BlockMeta()


@dataclass(frozen=True)
class BlockHeader:
    """A parsed block header."""

    namespace: bytes
    key: bytes
    meta: BlockMeta
    raw_len: int
    stored_len: int
    checksum: int
    version: int = VERSION
    digest: int | None = None  # the payload digest of a kind-1 block (xxh3 over the header only)

    @property
    def total_len(self) -> int:
        """Header plus stored payload, in bytes."""
        return HEADER_SIZE + self.stored_len


def header_bytes(
    namespace: bytes,
    key: bytes,
    meta: BlockMeta,
    codec_id: int,
    raw_len: int,
    stored_len: int,
    checksum: int,
    digest: int | None = None,
) -> bytes:
    """The 128 header bytes of a block (``checksum`` 0 while the checksum is computed);
    ``digest``: the payload digest of a kind-1 block."""
    shape = tuple(meta.shape) + (0,) * (MAX_RANK - len(meta.shape))
    tail = _PAD if digest is None else _DIGEST.pack(digest, DIGEST_KIND) + _DIGEST_PAD
    return (
        _FMT.pack(
            MAGIC,
            VERSION,
            codec_id,
            DTYPES[meta.dtype],
            len(meta.shape),
            namespace,
            key,
            raw_len,
            stored_len,
            checksum,
            *shape,
            meta.value,
        )
        + tail
    )


#: What :func:`encode_payload` returns: codec id, the meta naming the codec used, stored bytes.
Encoded = tuple[int, BlockMeta, memoryview]


def encode_payload(raw: memoryview, meta: BlockMeta) -> Encoded:
    """Encode ``raw`` with ``meta.codec``: (codec id, meta naming the codec used, stored bytes).

    Falls back to raw when the codec declines (its stored form would not gain enough: see
    :data:`kvtier.codec.zstd_frames.MIN_GAIN`).
    """
    codec = get_codec(meta.codec)
    if codec.id != RawCodec.id:
        stored = codec.encode(raw, meta.dtype, tuple(meta.shape))
        if stored is not None:
            return codec.id, meta, memoryview(stored).cast("B")
        meta = meta.with_codec(RawCodec.name)
    return RawCodec.id, meta, raw


def stored_raw(payload, meta: BlockMeta) -> BlockMeta:
    """``meta``, naming ``raw`` where its codec knows before encoding that ``payload`` will not
    gain (so a tier can write it on its raw path): a cheap look, not an encode."""
    codec = get_codec(meta.codec)
    declines = getattr(codec, "declines", None)
    if declines is None or not declines(memoryview(payload).cast("B"), meta.dtype):
        return meta
    return meta.with_codec(RawCodec.name)


def pack_block(
    namespace: bytes,
    key: bytes,
    payload,
    meta: BlockMeta = RAW_META,
    encoded: Encoded | None = None,
) -> tuple[bytes, memoryview]:
    """Encode ``payload`` with ``meta.codec``; return (header, stored payload) ready to write.

    The two parts are returned apart so tiers can write them without joining them in memory.
    A block its codec does not shrink enough is stored raw. ``encoded``: what
    ``encode_payload(payload, meta)`` already returned (encoded on another thread).
    """
    raw = memoryview(payload).cast("B")
    codec_id, meta, stored = encoded if encoded is not None else encode_payload(raw, meta)
    header = header_bytes(namespace, key, meta, codec_id, raw.nbytes, stored.nbytes, 0)
    h = xxhash.xxh3_64(header)
    h.update(stored)
    header = (
        header[:CHECKSUM_OFFSET] + struct.pack("<Q", h.intdigest()) + header[CHECKSUM_OFFSET + 8 :]
    )
    return header, stored


def digest_header(namespace: bytes, key: bytes, meta: BlockMeta, nbytes: int, digest: int) -> bytes:
    """The header of a raw block of digest kind 1 (``digest``: its payload's), sealed by the
    xxh3 over the header alone."""
    meta = meta.with_codec(RawCodec.name)
    zeroed = header_bytes(namespace, key, meta, RawCodec.id, nbytes, nbytes, 0, digest)
    checksum = xxhash.xxh3_64_intdigest(zeroed)
    at = CHECKSUM_OFFSET
    return zeroed[:at] + struct.pack("<Q", checksum) + zeroed[at + 8 :]


def _header_state(view) -> xxhash.xxh3_64:
    """The xxh3 state after a block's header with its checksum field zeroed."""
    h = xxhash.xxh3_64(view[:CHECKSUM_OFFSET])
    h.update(b"\x00" * 8)
    h.update(view[CHECKSUM_OFFSET + 8 : HEADER_SIZE])
    return h


def check_digest_header(view, header: BlockHeader) -> None:
    """Check the xxh3 over a kind-1 block's header (its payload is checked by the digest)."""
    if _header_state(view).intdigest() != header.checksum:
        raise CorruptBlockError("block header checksum mismatch")


def _check_digest_parts(view, parts, header: BlockHeader) -> None:
    """Verify a kind-1 block on the host: its header's xxh3 and its payload's digest."""
    check_digest_header(view, header)
    if payload_digest(*parts) != header.digest:
        raise CorruptBlockError("block payload digest mismatch")


def parse_header(buf, namespace: bytes | None = None, key: bytes | None = None) -> BlockHeader:
    """Parse and validate a header; check namespace and key when given. Raises BlockError."""
    view = memoryview(buf).cast("B")
    if view.nbytes < HEADER_SIZE:
        raise CorruptBlockError(f"block truncated: {view.nbytes} bytes, header needs {HEADER_SIZE}")
    magic, version, codec_id, dtype, rank, ns, k, raw_len, stored_len, checksum, *rest = (
        _FMT.unpack_from(view)
    )
    shape, value = rest[:MAX_RANK], rest[MAX_RANK]
    if magic != MAGIC:
        raise CorruptBlockError(f"not a kvtier block (magic {magic!r})")
    if version != VERSION:
        raise UnsupportedBlockError(f"block format version {version}; this kvtier reads {VERSION}")
    digest, kind = _DIGEST.unpack_from(view, DIGEST_OFFSET)
    if kind not in (0, DIGEST_KIND):
        raise UnsupportedBlockError(f"block digest kind {kind} is not known to this kvtier")
    if codec_id not in CODECS:
        raise UnsupportedBlockError(f"block codec id {codec_id} is not known to this kvtier")
    if dtype not in _DTYPE_NAMES or rank > MAX_RANK:
        raise CorruptBlockError(f"block header has dtype code {dtype} / rank {rank}")
    if namespace is not None and ns != namespace:
        raise ForeignBlockError("block belongs to another namespace")
    if key is not None and k != key:
        raise ForeignBlockError("block holds another key")
    if not value >= 0.0:  # also refuses NaN
        raise CorruptBlockError(f"block header has value {value}")
    meta = BlockMeta(_DTYPE_NAMES[dtype], tuple(shape[:rank]), CODECS[codec_id].name, value)
    digest_or_none = digest if kind == DIGEST_KIND else None
    return BlockHeader(ns, k, meta, raw_len, stored_len, checksum, version, digest_or_none)


def verify(view: memoryview, header: BlockHeader) -> None:
    """Check the stored length and checksum of a whole block (header + payload)."""
    if view.nbytes < header.total_len:
        raise CorruptBlockError(f"block truncated: {view.nbytes} of {header.total_len} bytes")
    if header.digest is not None:
        _check_digest_parts(view, (view[HEADER_SIZE : header.total_len],), header)
        return
    h = _header_state(view)
    h.update(view[HEADER_SIZE : header.total_len])
    if h.intdigest() != header.checksum:
        raise CorruptBlockError("block checksum mismatch")


def verify_parts(header_buf, parts, header: BlockHeader) -> None:
    """Check the checksum of a block whose stored payload lies in several buffers, in order.

    For tiers that keep the header apart from the payload (e.g. a disk page layout) or read a
    payload straight into the caller's buffer; raises CorruptBlockError like :func:`verify`.
    """
    view = memoryview(header_buf).cast("B")
    if header.digest is not None:
        n = sum(memoryview(p).nbytes for p in parts)
        if n != header.stored_len:
            raise CorruptBlockError(f"block truncated: {n} of {header.stored_len} payload bytes")
        _check_digest_parts(view, parts, header)
        return
    h = _header_state(view)
    n = 0
    for part in parts:
        h.update(part)
        n += memoryview(part).nbytes
    if n != header.stored_len:
        raise CorruptBlockError(f"block truncated: {n} of {header.stored_len} payload bytes")
    if h.intdigest() != header.checksum:
        raise CorruptBlockError("block checksum mismatch")


def unpack_into(
    buf, out, namespace: bytes | None = None, key: bytes | None = None, check: bool = True
) -> BlockHeader:
    """Validate a whole block in ``buf`` and decode its payload into ``out``.

    ``check=False`` skips the payload checksum (for trusted in-process memory); the header is
    always validated.
    """
    view = memoryview(buf).cast("B")
    header = parse_header(view, namespace, key)
    if check:
        verify(view, header)
    elif view.nbytes < header.total_len:
        raise CorruptBlockError(f"block truncated: {view.nbytes} of {header.total_len} bytes")
    target = memoryview(out).cast("B")
    if target.nbytes < header.raw_len:
        raise BufferTooSmallError(
            f"buffer of {target.nbytes} bytes cannot hold a {header.raw_len}-byte block"
        )
    stored = view[HEADER_SIZE : header.total_len]
    n = get_codec(header.meta.codec).decode_into(
        stored, target[: header.raw_len], header.meta.dtype
    )
    if n != header.raw_len:
        raise CorruptBlockError(f"block decoded to {n} bytes, header says {header.raw_len}")
    return header
