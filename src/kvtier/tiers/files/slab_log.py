"""The index log of a slab file: what a writer published, for other processes to read cheaply.

A process that reads another live writer's slab file learns of new blocks by rescanning it.
Reading every slot's header page costs one read per slot (a disk read under O_DIRECT) and grows
with the file, and a rescan runs on a reader's lookup path. So each writer also appends one
record per published block to ``<slab file>.log``: the log's generation (u32), the slot (u32)
and the block's 128 header bytes as stored. A reader keeps its offset into each log and parses
only the records added since its last look; the slot's bytes stay the truth (every read checks
the header and checksum), so a record is only ever a hint: a stale one is a miss, a lost one a
block not seen until the next full scan.

A block that leaves a slot (evicted, deleted, overwritten elsewhere) is recorded too: a record
whose slot has the ``VACATED`` bit set and whose header bytes are zero. An evicted block's bytes
stay in its slot until the slot is reused and would still pass every check, so without that
record a reader would keep listing a block its writer no longer holds, and promise it.

The writer starts a log empty under a random generation and, once it holds more records than
``ROTATE_FACTOR`` times the file's slots, empties it, takes the next generation and records
every slot that holds no block as vacated. A reader that finds the log shorter than its offset,
a record of another generation, or no log at all falls back to scanning every slot once, and
then reads the log of that generation from its start (what a scan cannot tell: which slots'
blocks have left), and follows it from there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator

from kvtier.codec import HEADER_SIZE

LOG = ".log"
_REC = struct.Struct("<II")
RECORD = _REC.size + HEADER_SIZE
#: A log is emptied once it holds this many times its file's slots in records (and at least
#: ``ROTATE_MIN`` records), so it stays a small multiple of the file's index.
ROTATE_FACTOR = 4
ROTATE_MIN = 1024
#: Set in a record's slot: the block recorded in that slot before has left it.
VACATED = 1 << 31
_NO_HEAD = bytes(HEADER_SIZE)


class SlabLog:
    """The writer's end: appends a record per published block and per vacated slot (errors
    only lose hints). ``vacant``: the slots that hold no block now, recorded when the log
    starts a new generation."""

    def __init__(self, slab_path: str, vacant: Callable[[], Iterable[int]] | None = None):
        self.path = slab_path + LOG
        self.gen = secrets.randbits(32)
        self.records = 0
        self._vacant = vacant
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
            self._fd: int | None = os.open(self.path, flags, 0o644)
        except OSError:
            self._fd = None

    def append(self, slot: int, head: bytes, slots: int) -> None:
        """Record that ``slot`` now holds the block whose stored header is ``head``; ``slots``:
        the file's slots now (the log rotates past a multiple of them)."""
        if len(head) == HEADER_SIZE and 0 <= slot < VACATED:
            self._add(slot, head, slots)

    def vacate(self, slot: int, slots: int) -> None:
        """Record that the block in ``slot`` has left it (``slots``: as for :meth:`append`)."""
        if 0 <= slot < VACATED:
            self._add(slot | VACATED, _NO_HEAD, slots)

    def _add(self, field: int, head: bytes, slots: int) -> None:
        if self._fd is None:
            return
        if self.records >= max(ROTATE_MIN, ROTATE_FACTOR * slots):
            self._restart()
        self._write([(field, head)])

    def _write(self, records: list[tuple[int, bytes]], restart: bool = True) -> None:
        data = b"".join(_REC.pack(self.gen, slot) + head for slot, head in records)
        try:
            written = os.write(self._fd, data) if self._fd is not None else -1
        except OSError:
            written = -1
        if written == len(data):
            self.records += len(records)
        elif written > 0 and restart:  # a short write (a full disk) would shift later records
            self._restart()

    def _restart(self) -> None:
        """Empty the log under the next generation (readers scan the file once) and record the
        slots that hold no block (a scan would list an evicted block still in its slot)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        self.gen = (self.gen + 1) & 0xFFFFFFFF
        self.records = 0
        vacant = sorted(self._vacant()) if self._vacant is not None else []
        if vacant:
            self._write([(s | VACATED, _NO_HEAD) for s in vacant if s < VACATED], restart=False)

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
        """Before a full scan: read the log again from its start (the scan lists blocks, the
        log also says which of them have left their slots)."""
        self.offset, self.gen = 0, None

    def new(self) -> Iterator[tuple[int, bytes | None]] | None:
        """(slot, header bytes, or None where the slot was vacated) of the records added since
        the last call, in order, or None when the log cannot be followed (absent, emptied, of
        another generation): scan the file instead. The last record read before is read
        again: a log emptied and refilled past the offset meanwhile shows another generation
        there."""
        fd = self._open()
        if fd is None:
            return None
        start = max(0, self.offset - RECORD)
        try:
            size = os.fstat(fd).st_size
            if size < self.offset:
                return None
            data = os.pread(fd, (size - start) // RECORD * RECORD, start)
        except OSError:
            return None
        if len(data) < self.offset - start:
            return None
        out: list[tuple[int, bytes | None]] = []
        for at in range(0, len(data) - RECORD + 1, RECORD):
            gen, slot = _REC.unpack_from(data, at)
            if self.gen is None:
                self.gen = gen
            elif gen != self.gen:
                return None
            if start + at < self.offset:  # the record read last time: only its generation
                continue
            if slot & VACATED:
                out.append((slot & ~VACATED, None))
            else:
                out.append((slot, data[at + _REC.size : at + RECORD]))
        self.offset = start + len(data) // RECORD * RECORD
        return iter(out)

    def close(self) -> None:
        """Close the log's descriptor."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


__all__ = ["LOG", "RECORD", "VACATED", "LogTail", "SlabLog"]
