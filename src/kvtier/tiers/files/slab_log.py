"""The index log of a slab file: what a writer published, for other processes to read cheaply.

A process that reads another live writer's slab file learns of new blocks by rescanning it.
Reading every slot's header page costs one read per slot (a disk read under O_DIRECT) and grows
with the file, and a rescan runs on a reader's lookup path. So each writer also appends one
record per published block to ``<slab file>.log``: the log's generation (u32), the slot (u32)
and the block's 128 header bytes as stored. A reader keeps its offset into each log and parses
only the records added since its last look; the slot's bytes stay the truth (every read checks
the header and checksum), so a record is only ever a hint: a stale one is a miss, a lost one a
block not seen until the next full scan.

The writer starts a log empty under a random generation and, once it holds more records than
``ROTATE_FACTOR`` times the file's slots, empties it and takes the next generation. A reader
that finds the log shorter than its offset, a record of another generation, or no log at all
falls back to scanning every slot once, and follows the log again from there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import struct
from collections.abc import Iterator

from kvtier.codec import HEADER_SIZE

LOG = ".log"
_REC = struct.Struct("<II")
RECORD = _REC.size + HEADER_SIZE
#: A log is emptied once it holds this many times its file's slots in records (and at least
#: ``ROTATE_MIN`` records), so it stays a small multiple of the file's index.
ROTATE_FACTOR = 4
ROTATE_MIN = 1024


class SlabLog:
    """The writer's end: appends a record per published block (errors only lose hints)."""

    def __init__(self, slab_path: str):
        self.path = slab_path + LOG
        self.gen = secrets.randbits(32)
        self.records = 0
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
            self._fd: int | None = os.open(self.path, flags, 0o644)
        except OSError:
            self._fd = None

    def append(self, slot: int, head: bytes, slots: int) -> None:
        """Record that ``slot`` now holds the block whose stored header is ``head``; ``slots``:
        the file's slots now (the log rotates past a multiple of them)."""
        if self._fd is None or len(head) != HEADER_SIZE or not 0 <= slot < 1 << 32:
            return
        if self.records >= max(ROTATE_MIN, ROTATE_FACTOR * slots):
            self._restart()
        record = _REC.pack(self.gen, slot) + head
        try:
            written = os.write(self._fd, record)
        except OSError:
            written = -1
        if written == len(record):
            self.records += 1
        elif written > 0:  # a short write (a full disk) would shift every later record
            self._restart()

    def _restart(self) -> None:
        """Empty the log under the next generation (readers scan the file once)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        self.gen = (self.gen + 1) & 0xFFFFFFFF
        self.records = 0

    def close(self) -> None:
        """Stop writing (the log stays for readers; the file's next writer empties it)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class LogTail:
    """A reader's end: the records another writer appended since the last call."""

    def __init__(self, slab_path: str):
        self.path = slab_path + LOG
        self.offset = 0
        self.gen: int | None = None
        self._fd: int | None = None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        return self._fd

    def mark(self) -> None:
        """Before a full scan: follow the log from its present end (what the scan covers)."""
        self.offset, self.gen = 0, None
        fd = self._open()
        if fd is None:
            return
        try:
            size = os.fstat(fd).st_size // RECORD * RECORD
            last = os.pread(fd, RECORD, size - RECORD) if size else b""
        except OSError:
            return
        self.offset = size
        if len(last) == RECORD:
            self.gen = _REC.unpack_from(last)[0]

    def new(self) -> Iterator[tuple[int, bytes]] | None:
        """(slot, header bytes) of the records added since the last call, or None when the log
        cannot be followed (absent, emptied, of another generation): scan the file instead."""
        fd = self._open()
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < self.offset:
                return None
            data = os.pread(fd, (size - self.offset) // RECORD * RECORD, self.offset)
        except OSError:
            return None
        out: list[tuple[int, bytes]] = []
        for at in range(0, len(data) - RECORD + 1, RECORD):
            gen, slot = _REC.unpack_from(data, at)
            if self.gen is None:
                self.gen = gen
            elif gen != self.gen:
                return None
            out.append((slot, data[at + _REC.size : at + RECORD]))
        self.offset += len(data) // RECORD * RECORD
        return iter(out)

    def close(self) -> None:
        """Close the log's descriptor."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


__all__ = ["LOG", "RECORD", "LogTail", "SlabLog"]
