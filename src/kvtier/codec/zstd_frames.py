"""zstd frames with checked sizes, for the codecs (zstandard, one fresh context per call)."""

from __future__ import annotations

import zstandard

from kvtier.codec.errors import CorruptBlockError

#: A codec stores a block encoded only when that saves at least this share of its raw bytes;
#: below it the block is stored raw (and its header says so).
MIN_GAIN = 1 / 32


def gains(stored: int, raw: int) -> bool:
    """Whether ``stored`` bytes in place of ``raw`` save at least :data:`MIN_GAIN`."""
    return stored <= raw * (1 - MIN_GAIN)


#: Bytes of a block zstd tries first: a block whose first ``PROBE_BYTES`` do not shrink to
#: ``PROBE_MAX_SHARE`` of their size (random bytes, data already compressed) is stored raw
#: without compressing the rest.
PROBE_BYTES = 4 * 1024
PROBE_MAX_SHARE = 0.9


def flat_bytes(view: memoryview) -> memoryview:
    """``view`` as a one-dimensional view of unsigned bytes (no copy)."""
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def shrinks(sample, level: int = 1) -> bool:
    """Whether zstd shrinks ``sample`` to at most :data:`PROBE_MAX_SHARE` of its size."""
    return len(zstd_compress(sample, level)) <= PROBE_MAX_SHARE * len(memoryview(sample))


def head_declines(raw: memoryview, level: int = 1) -> bool:
    """Whether a block (a flat byte view) is worth probing, being over twice
    :data:`PROBE_BYTES`, and its first ``PROBE_BYTES`` do not :func:`shrink <shrinks>`."""
    return raw.nbytes > 2 * PROBE_BYTES and not shrinks(raw[:PROBE_BYTES], level)


def zstd_compress(data, level: int = 1) -> bytes:
    """One zstd frame of ``data`` with its content size (a fresh context: thread-safe)."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def zstd_decompress(frame, size: int) -> bytes:
    """The ``size`` bytes one zstd frame holds; CorruptBlockError for anything else.

    The frame's declared content size is checked before anything is allocated, so a corrupt
    frame can neither make it allocate more than ``size`` nor return fewer or more bytes.
    """
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise CorruptBlockError(f"zstd frame header unreadable: {exc}") from None
    if declared != size:
        raise CorruptBlockError(f"zstd frame declares {declared} bytes, expected {size}")
    try:
        out = zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise CorruptBlockError(f"zstd frame does not decode: {exc}") from None
    if len(out) != size:
        raise CorruptBlockError(f"zstd frame decoded to {len(out)} bytes, expected {size}")
    return out
