"""Payload codecs by id. ``raw`` stores bytes as they are; lossless KV codecs register here."""

from __future__ import annotations

from typing import ClassVar, Protocol

from kvtier.errors import ConfigError


class Codec(Protocol):
    """Turns raw KV bytes into stored bytes and back, losslessly."""

    name: ClassVar[str]
    id: ClassVar[int]

    def encode(self, raw: memoryview, dtype: str) -> bytes | memoryview:
        """Stored form of ``raw``."""
        ...

    def decode_into(self, stored: memoryview, out: memoryview, dtype: str) -> int:
        """Write the raw bytes of ``stored`` into ``out``; return how many were written."""
        ...


class RawCodec:
    """The identity codec: stored bytes are the raw bytes."""

    name: ClassVar[str] = "raw"
    id: ClassVar[int] = 0

    def encode(self, raw: memoryview, dtype: str) -> memoryview:
        return raw

    def decode_into(self, stored: memoryview, out: memoryview, dtype: str) -> int:
        n = stored.nbytes
        out[:n] = stored
        return n


CODECS: dict[int, Codec] = {RawCodec.id: RawCodec()}


def get_codec(which: int | str) -> Codec:
    """A codec by id or name."""
    for codec in CODECS.values():
        if which in (codec.id, codec.name):
            return codec
    names = ", ".join(c.name for c in CODECS.values())
    raise ConfigError(f"unknown codec {which!r}; available: {names}")
