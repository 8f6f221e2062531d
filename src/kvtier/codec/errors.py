"""Why a stored block cannot be served: the errors the container and the codecs raise."""

from __future__ import annotations

from kvtier.errors import KvtierError


class BlockError(KvtierError):
    """A stored block cannot be served. The cache counts it as a miss and deletes it."""


class CorruptBlockError(BlockError):
    """Bad magic, a length mismatch, a truncated block or a checksum that does not match."""


class ForeignBlockError(BlockError):
    """The block belongs to another namespace or key (another model, dtype, tenant …)."""


class UnsupportedBlockError(BlockError):
    """The block was written by an unknown format version or codec."""


class BufferTooSmallError(KvtierError, ValueError):
    """The caller's buffer cannot hold the block's raw payload; size it from the header."""


__all__ = [
    "BlockError",
    "BufferTooSmallError",
    "CorruptBlockError",
    "ForeignBlockError",
    "UnsupportedBlockError",
]
