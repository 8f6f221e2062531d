"""GET replies read straight into the caller's buffers.

redis-py with hiredis copies a value three times before the tier sees it (socket → the
parser's buffer → hiredis's reader → a new bytes object), and the tier then copies it once more
into the caller's buffer. For a single server (not a cluster) the tier sends a batch's GETs on a
connection from redis-py's pool and reads the replies itself: each value's header into a small
buffer, where it is checked, then a raw payload straight from the socket into the caller's
buffer, and the checksum over what arrived; a coded one lands in a staging buffer and is checked
and decoded afterwards, a batch's on every core.

A reply this reader does not take whole — a block split over several values, a header that says
another length — comes back as its bytes for the tier's general path. Anything wrong with the
connection (a timeout, a reset, an error reply) closes it and raises as redis-py would, so the
pool never hands out a connection in the middle of a reply.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvtier.codec import (
    HEADER_SIZE,
    BlockError,
    BlockHeader,
    BufferTooSmallError,
    get_codec,
    parse_header,
)
from kvtier.codec.container import CorruptBlockError, verify_parts
from kvtier.tiers.shared import byte_windows

_SCRATCH = 64 * 1024
_MAX_LINE = 64
#: Bytes of replies asked for at a time (see :func:`read_values`).
WINDOW_BYTES = 8 * 1024 * 1024


class _Wire:
    """A socket with a small read-ahead buffer: reply lines from the buffer, large values past
    it into the caller's memory."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray(_SCRATCH)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.received = 0  # bytes of the replies so far (what a timeout report names)

    def _recv(self, into: memoryview) -> int:
        n = self.sock.recv_into(into)
        if n == 0:
            raise RedisConnectionError("the Redis server closed the connection")
        self.received += n
        return n

    def line(self) -> bytes:
        """The next reply line, without its CRLF."""
        while True:
            i = self.buf.find(b"\r\n", self.start, self.end)
            if i >= 0:
                out = bytes(self.view[self.start : i])
                self.start = i + 2
                return out
            if self.end - self.start > _MAX_LINE:
                raise ResponseError("a reply line from the server is too long")
            if self.start:
                pending = self.end - self.start
                self.buf[:pending] = self.view[self.start : self.end]
                self.start, self.end = 0, pending
            self.end += self._recv(self.view[self.end :])

    def read_into(self, target: memoryview) -> None:
        """Fill ``target`` with the next bytes: what is buffered, then straight from the socket."""
        have = min(target.nbytes, self.end - self.start)
        target[:have] = self.view[self.start : self.start + have]
        self.start += have
        got = have
        while got < target.nbytes:
            got += self._recv(target[got:])

    def skip(self, n: int) -> None:
        """Read and drop ``n`` bytes."""
        while n:
            take = min(n, self.end - self.start)
            if take:
                self.start += take
                n -= take
                continue
            self.start = self.end = 0
            self.end = self._recv(self.view)


def read_values(
    conn,
    names: Sequence[str],
    keys: Sequence[bytes],
    outs: Sequence,
    namespace: bytes,
    window: int | None = None,
    coded: Callable[[Coded], object] | None = None,
    stage: Callable[[int], np.ndarray] | None = None,
) -> list:
    """Send ``GET name`` for each name on ``conn`` and read each reply.

    Per name: the block's header (its raw payload checked in the matching ``out``), a
    :class:`Coded` block still to check and decode (or what ``coded`` made of it as soon as it
    arrived: e.g. its decode started on another thread, so the next replies are read
    meanwhile), a BlockError for a block that fails its checks (a miss), None for a missing
    key, or the value's bytes where the block is not whole in this one value (the caller's
    general path takes it). A coded block's bytes land in a buffer of ``stage(n)`` (at least
    ``n`` bytes, handed back with the block as :attr:`Coded.lent`), else in a new one.

    The GETs go out in windows of about ``window`` bytes of replies (by the buffers' sizes;
    :data:`WINDOW_BYTES` by default), the next window asked for as soon as the current one's
    first reply arrives: the server copies every reply of what it has read into its output
    buffers before it writes the first byte, so one pipeline of many large values keeps the
    socket silent for longer than the tier's timeout on a healthy server.
    """
    groups = byte_windows([memoryview(o).nbytes for o in outs], window or WINDOW_BYTES)

    def send(g: int) -> None:
        if g < len(groups):
            a, b = groups[g]
            conn.send_packed_command(conn.pack_commands([("GET", n) for n in names[a:b]]))

    send(0)
    sock = getattr(conn, "_sock", None)
    if sock is None:
        raise RedisConnectionError("the Redis connection has no socket")
    wire = _Wire(sock)
    out: list[BlockHeader | BlockError | bytes | None] = []
    try:
        for g, (a, b) in enumerate(groups):
            # the server is writing window g once its first reply line is here: ask for the
            # next window then, so it copies that while this one drains
            for i in range(a, b):
                started = (lambda g=g: send(g + 1)) if i == a else None
                got = _one(wire, keys[i], outs[i], namespace, started, stage)
                out.append(coded(got) if coded is not None and isinstance(got, Coded) else got)
        return out
    except TimeoutError:
        raise RedisTimeoutError(
            f"Timeout reading from the Redis server (no byte within {sock.gettimeout()} s, "
            f"{wire.received} bytes of {len(names)} replies read)"
        ) from None
    except OSError as exc:
        raise RedisConnectionError(f"Error reading from the Redis server: {exc}") from None


def _one(
    wire: _Wire,
    key: bytes,
    out,
    namespace: bytes,
    started: Callable[[], None] | None = None,
    stage: Callable[[int], np.ndarray] | None = None,
):
    line = wire.line()
    if started is not None:
        started()
    kind, rest = line[:1], line[1:]
    if kind == b"-":
        raise ResponseError(rest.decode(errors="replace"))
    if kind == b"_":  # RESP3's null: no such key
        return None
    if kind != b"$" or not rest.lstrip(b"-").isdigit():
        raise ResponseError(f"unexpected reply to GET: {line[:40]!r}")
    n = int(rest)
    if n < 0:
        return None
    if n < HEADER_SIZE:
        wire.skip(n + 2)
        return CorruptBlockError(f"block truncated: {n} bytes")
    head = memoryview(bytearray(HEADER_SIZE))
    wire.read_into(head)
    try:
        header = parse_header(head, namespace, key)
    except BlockError as exc:
        wire.skip(n - HEADER_SIZE + 2)
        return exc
    if header.total_len != n:  # split over several values, or not what it says: general path
        body = memoryview(bytearray(n))
        body[:HEADER_SIZE] = head
        wire.read_into(body[HEADER_SIZE:])
        wire.skip(2)
        return bytes(body)
    target = memoryview(out).cast("B")
    if target.nbytes < header.raw_len:
        raise BufferTooSmallError(  # the caller closes the connection mid-reply
            f"buffer of {target.nbytes} bytes cannot hold a {header.raw_len}-byte block"
        )
    raw = header.meta.codec == "raw" and header.stored_len == header.raw_len
    lent = None
    if raw:
        stored = target[: header.raw_len]
    elif stage is not None:
        lent = stage(header.stored_len)
        stored = memoryview(lent).cast("B")[: header.stored_len]
    else:
        stored = memoryview(bytearray(header.stored_len))
    wire.read_into(stored)
    wire.skip(2)
    if not raw:
        return Coded(head, stored, header, target, lent)
    try:
        verify_parts(head, (stored,), header)
    except BlockError as exc:
        return exc
    return header


@dataclass(frozen=True)
class Coded:
    """A coded block read off the wire, to be checked and decoded (on any thread)."""

    head: memoryview
    stored: memoryview
    header: BlockHeader
    target: memoryview
    lent: np.ndarray | None = None  # the staging buffer ``stored`` lies in, to give back

    def finish(self) -> BlockHeader | BlockError:
        """Check the checksum and decode into the caller's buffer; the header or the error."""
        header = self.header
        try:
            verify_parts(self.head, (self.stored,), header)
            got = get_codec(header.meta.codec).decode_into(
                self.stored, self.target[: header.raw_len], header.meta.dtype
            )
            if got != header.raw_len:
                raise CorruptBlockError(
                    f"block decoded to {got} bytes, header says {header.raw_len}"
                )
        except BlockError as exc:
            return exc
        return header


__all__ = ["WINDOW_BYTES", "Coded", "byte_windows", "read_values"]
