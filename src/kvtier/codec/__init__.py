"""Lossless codecs for KV bytes and the self-describing, checksummed block container."""

from kvtier.codec.codecs import CODECS, Codec, RawCodec, get_codec
from kvtier.codec.container import (
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

__all__ = [
    "CODECS",
    "HEADER_SIZE",
    "BlockError",
    "BlockHeader",
    "BlockMeta",
    "BufferTooSmallError",
    "Codec",
    "CorruptBlockError",
    "ForeignBlockError",
    "RawCodec",
    "UnsupportedBlockError",
    "get_codec",
    "pack_block",
    "parse_header",
    "unpack_into",
]
