"""Payload codecs by id (the id is recorded in every block header).

``raw`` stores bytes as they are, ``zstd`` is zstandard level 1 over the bytes as they are (the
baseline), ``kv`` is the byte-plane KV codec for 16-bit floats (:mod:`kvtier.codec.planes`).
Every codec is lossless and returns exactly the bytes it was given.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import numpy as np

from kvtier.codec.errors import CorruptBlockError
from kvtier.codec.planes import PlaneCodec
from kvtier.codec.zstd_frames import (
    flat_bytes,
    gains,
    head_declines,
    zstd_compress,
    zstd_decompress,
)
from kvtier.errors import ConfigError


class Codec(Protocol):
    """Turns raw KV bytes into stored bytes and back, losslessly.

    ``encode`` gets the element dtype and the block's shape (both from the block's
    :class:`~kvtier.codec.container.BlockMeta`, the shape may be empty); ``decode_into`` gets
    only the stored bytes and the dtype, so whatever else decoding needs is in the stored bytes.
    A stored form that does not decode to at most ``out``'s size raises CorruptBlockError.
    """

    name: ClassVar[str]
    id: ClassVar[int]

    def encode(
        self, raw: memoryview, dtype: str, shape: tuple[int, ...] = ()
    ) -> bytes | memoryview:
        """Stored form of ``raw``."""
        ...

    def decode_into(self, stored: memoryview, out: memoryview, dtype: str) -> int:
        """Write the raw bytes of ``stored`` into ``out``; return how many were written."""
        ...


#: Payloads at least this large are copied by numpy, which releases the GIL while it copies.
_GIL_FREE_COPY = 64 * 1024


class RawCodec:
    """The identity codec: stored bytes are the raw bytes."""

    name: ClassVar[str] = "raw"
    id: ClassVar[int] = 0

    def encode(self, raw: memoryview, dtype: str, shape: tuple[int, ...] = ()) -> memoryview:
        return raw

    def decode_into(self, stored: memoryview, out: memoryview, dtype: str) -> int:
        n = stored.nbytes
        if n > out.nbytes:
            raise CorruptBlockError(
                f"raw payload of {n} bytes exceeds the {out.nbytes}-byte buffer"
            )
        if n >= _GIL_FREE_COPY:  # numpy copies without the GIL: other threads run meanwhile
            np.copyto(np.frombuffer(out, np.uint8, n), np.frombuffer(stored, np.uint8, n))
        else:
            out[:n] = stored
        return n


class ZstdCodec:
    """zstandard level 1 over the payload's bytes as they are: the baseline the KV codec beats.

    Stored form: the raw length (u64 little-endian), then one zstd frame.
    """

    name: ClassVar[str] = "zstd"
    id: ClassVar[int] = 1
    level: ClassVar[int] = 1

    def encode(self, raw: memoryview, dtype: str, shape: tuple[int, ...] = ()) -> bytes | None:
        raw = flat_bytes(raw)
        if head_declines(raw, self.level):
            return None  # its first bytes do not shrink (random, already compressed…): raw
        stored = raw.nbytes.to_bytes(8, "little") + zstd_compress(raw, self.level)
        return stored if gains(len(stored), raw.nbytes) else None

    def decode_into(self, stored: memoryview, out: memoryview, dtype: str) -> int:
        if stored.nbytes < 8:
            raise CorruptBlockError(f"zstd payload of {stored.nbytes} bytes is truncated")
        n = int.from_bytes(stored[:8], "little")
        if n > out.nbytes:
            raise CorruptBlockError(f"zstd payload says {n} bytes, the buffer holds {out.nbytes}")
        out[:n] = zstd_decompress(stored[8:], n)
        return n


CODECS: dict[int, Codec] = {c.id: c for c in (RawCodec(), ZstdCodec(), PlaneCodec())}
#: Codec names a tier's ``codec=`` option takes.
CODEC_NAMES: tuple[str, ...] = tuple(c.name for c in CODECS.values())


def get_codec(which: int | str) -> Codec:
    """A codec by id or name."""
    for codec in CODECS.values():
        if which in (codec.id, codec.name):
            return codec
    names = ", ".join(c.name for c in CODECS.values())
    raise ConfigError(f"unknown codec {which!r}; available: {names}")
