"""redis-py connections that send a block's value from its own buffers, without copying it.

With hiredis installed, redis-py packs every command with ``hiredis.pack_command``, which copies
the whole value into one new buffer; for the tier's megabyte values that copy (and the fresh
pages it lands in) costs more than sending them. These connections pack commands with redis-py's
Python packer, which sends a large value as a separate piece of the same write, and extend it
with :class:`Pieces`: one value given as several buffers (a block's header and its stored
payload) that go out one after the other, never joined in memory. Replies are still parsed by
hiredis.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.connection import PythonRespSerializer


class Pieces:
    """One command argument made of several buffers, sent back to back as a single value."""

    __slots__ = ("nbytes", "parts")

    def __init__(self, parts: Sequence):
        self.parts = [memoryview(p).cast("B") for p in parts]
        self.nbytes = sum(p.nbytes for p in self.parts)

    def chunks(self, lead: bytes, cutoff: int) -> list:
        """What goes on the wire for this value after ``lead``: small parts joined into the
        bytes around them (one send), large ones as they are; the last item is always bytes."""
        out: list = []
        small = [lead]
        for part in self.parts:
            if part.nbytes > cutoff:
                out += [b"".join(small), part]
                small = []
            else:
                small.append(part.tobytes())
        return [*out, b"".join(small)]


class PiecesPacker(PythonRespSerializer):
    """redis-py's Python command packer, which also takes :class:`Pieces` arguments."""

    def pack(self, *args):
        if not any(type(a) is Pieces for a in args):
            return super().pack(*args)
        if isinstance(args[0], str):  # "CONFIG GET"-style names, as the base packer does
            args = (*args[0].encode().split(), *args[1:])
        out: list = []
        buff = b"*%d\r\n" % len(args)
        for arg in args:
            if type(arg) is Pieces:
                *sent, tail = arg.chunks(buff + b"$%d\r\n" % arg.nbytes, self._buffer_cutoff)
                out += sent
                buff = tail + b"\r\n"
            else:
                data = self.encode(arg)
                buff += b"$%d\r\n%s\r\n" % (len(data), data)
        out.append(buff)
        return out


class _PackInPlace:
    """Mixin: the connection packs commands with :class:`PiecesPacker`."""

    def _construct_command_packer(self, packer):
        return packer or PiecesPacker(self._buffer_cutoff, self.encoder.encode)


class ValueConnection(_PackInPlace, redis.Connection):
    """A TCP connection whose values go out without a packing copy."""


class ValueSSLConnection(_PackInPlace, redis.SSLConnection):
    """A TLS connection whose values go out without a packing copy."""


__all__ = ["Pieces", "PiecesPacker", "ValueConnection", "ValueSSLConnection"]
