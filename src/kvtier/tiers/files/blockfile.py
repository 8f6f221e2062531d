"""The on-disk form of a block and the buffers that move it.

A block file is one 4 KiB header page (the 128-byte self-describing header, zero padded), then
the stored payload, zero padded to whole pages::

    [ header | 0 ... ][ payload ........................ | 0 ... ]
    0          128    4096                                         4096 + align_up(stored)

The header holds the true length and the checksum. The page layout lets O_DIRECT move an
aligned payload straight between the device and the caller's buffer (only the header page and
the last partial page go through scratch); anything else goes through one aligned scratch
buffer and is copied once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.codec import (
    HEADER_SIZE,
    BlockHeader,
    BufferTooSmallError,
    CorruptBlockError,
    get_codec,
    parse_header,
)
from kvtier.codec.container import verify_parts
from kvtier.tiers.io.buffers import PAGE, BufferPool, align_down, align_up, is_aligned


def file_size(stored_len: int) -> int:
    """Bytes of the file of a block whose stored payload has ``stored_len`` bytes."""
    return PAGE + align_up(stored_len)


@dataclass(slots=True)
class ReadPlan:
    """Buffers for one block read: the header page, maybe the caller's buffer, the tail."""

    size: int  # bytes of the file
    target: memoryview  # the caller's buffer
    bulk: int  # payload bytes read straight into target
    scratch: np.ndarray
    bufs: list = field(default_factory=list)


@dataclass(slots=True)
class WritePlan:
    """Buffers for one block write (``keep`` holds the payload alive until written)."""

    size: int
    scratch: np.ndarray
    keep: object
    bufs: list = field(default_factory=list)


def plan_read(size: int, out, pool: BufferPool, *, direct: bool, maybe_raw: bool) -> ReadPlan:
    """Buffers to read a block file of ``size`` bytes for the caller's buffer ``out``.

    With ``maybe_raw`` (the payload may be stored as is) and an aligned ``out`` (or buffered
    I/O), whole payload pages go straight into ``out``, never past the payload's end: a file
    of ``size`` bytes holds more than ``size - 2 pages`` payload bytes.
    """
    if size < PAGE or size % PAGE:
        raise CorruptBlockError(f"block file has {size} bytes, not whole 4 KiB pages: truncated")
    target = memoryview(out).cast("B")
    bulk = 0
    if maybe_raw and (not direct or is_aligned(target)):
        bulk = min(align_down(target.nbytes), max(0, size - 2 * PAGE))
    scratch = pool.take(size - bulk)
    plan = ReadPlan(size, target, bulk, scratch)
    plan.bufs = page_bufs(scratch, target, bulk, size)
    return plan


KnownHeader = tuple[bytes, BlockHeader]
"""A header's 128 bytes and what they parse to (for this namespace and key)."""


def finish_read(
    plan: ReadPlan,
    res: int,
    namespace: bytes,
    key: bytes,
    pool: BufferPool,
    known: KnownHeader | None = None,
) -> tuple[BlockHeader, KnownHeader]:
    """Check what ``plan`` read (``res`` bytes) and complete the caller's buffer.

    ``known`` (from an earlier read of this key) skips parsing a header whose bytes are the
    same; the checksum is verified either way. Returns the header and its ``known`` pair.
    Raises a BlockError for a short, foreign or damaged block, BufferTooSmallError when the
    caller's buffer cannot hold it. The scratch goes back to ``pool`` either way.
    """
    try:
        if res != plan.size:
            raise CorruptBlockError(f"block file truncated: read {res} of {plan.size} bytes")
        page = plan.scratch[:HEADER_SIZE]
        head = page.tobytes()
        if known is not None and known[0] == head:
            header = known[1]
        else:
            known = (head, parse_header(head, namespace, key))
            header = known[1]
        stored, bulk, target = header.stored_len, plan.bulk, plan.target
        if file_size(stored) != plan.size:
            raise CorruptBlockError(
                f"block file has {plan.size} bytes; its header says {stored} payload bytes"
            )
        if target.nbytes < header.raw_len:
            raise BufferTooSmallError(
                f"buffer of {target.nbytes} bytes cannot hold a {header.raw_len}-byte block"
            )
        tail = plan.scratch[PAGE : PAGE + stored - bulk]
        if header.meta.codec == "raw":
            verify_parts(page, (target[:bulk], tail), header)
            if stored > bulk:
                np.copyto(np.frombuffer(target, np.uint8, stored - bulk, bulk), tail)
        else:
            _decode(plan, header, tail, pool)
        return header, known
    finally:
        pool.give(plan.scratch)


def _decode(plan: ReadPlan, header: BlockHeader, tail: np.ndarray, pool: BufferPool) -> None:
    stored, bulk = header.stored_len, plan.bulk
    joined = None
    if bulk:  # the payload was split between the caller's buffer and the scratch: join it
        joined = pool.take(stored)
        np.copyto(joined[:bulk], np.frombuffer(plan.target, np.uint8, bulk))
        joined[bulk:stored] = tail
        tail = joined[:stored]
    try:
        verify_parts(plan.scratch[:HEADER_SIZE], (tail,), header)
        codec = get_codec(header.meta.codec)
        target = memoryview(plan.target).cast("B")[: header.raw_len]
        n = codec.decode_into(memoryview(tail), target, header.meta.dtype)
        if n != header.raw_len:
            raise CorruptBlockError(f"block decoded to {n} bytes, header says {header.raw_len}")
    finally:
        if joined is not None:
            pool.give(joined)


def plan_write(header: bytes, stored: memoryview, pool: BufferPool, *, direct: bool) -> WritePlan:
    """Buffers that write the block file of (``header``, ``stored``) in one vectored call.

    An aligned payload (or any payload with buffered I/O) is written from where it is, but for
    its last partial page; otherwise it is copied once into aligned scratch.
    """
    n = stored.nbytes
    size = file_size(n)
    bulk = align_down(n) if not direct or is_aligned(stored) else 0
    scratch = pool.take(size - bulk)
    scratch[:HEADER_SIZE] = np.frombuffer(header, np.uint8)
    scratch[HEADER_SIZE:PAGE] = 0
    tail = n - bulk
    if tail:
        np.copyto(scratch[PAGE : PAGE + tail], np.frombuffer(stored, np.uint8, tail, bulk))
    scratch[PAGE + tail : size - bulk] = 0
    plan = WritePlan(size, scratch, stored)
    plan.bufs = page_bufs(scratch, stored, bulk, size)
    return plan


def page_bufs(scratch: np.ndarray, payload: memoryview, bulk: int, size: int) -> list:
    """The buffers of a block file of ``size`` bytes: the header page from ``scratch``, then
    ``bulk`` payload bytes straight from or into ``payload``, then the rest from ``scratch``."""
    bufs: list = [scratch[:PAGE]]
    if bulk:
        bufs.append(payload[:bulk])
    if size - PAGE - bulk:
        bufs.append(scratch[PAGE : size - bulk])
    return bufs
