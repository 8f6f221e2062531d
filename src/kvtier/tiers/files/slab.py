"""Local-disk tier in slab files (``slab://``): fixed-size slots, one positional op per block.

Blocks of one size class share a few files per writer; a write is one ``pwritev`` of header,
payload and tail at a free slot, published by its checksum; other live writers' blocks are
followed through their index log. Layout, publication, writers, capacity: docs/ARCHITECTURE.md
("The slab tier").
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import math
import os
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvtier.codec import HEADER_SIZE, BlockHeader, BlockMeta, get_codec, parse_header
from kvtier.codec.container import (
    BlockError,
    BufferTooSmallError,
    CorruptBlockError,
    Encoded,
    encode_payload,
    header_bytes,
)
from kvtier.errors import ConfigError
from kvtier.tiers.files.base import NOSPACE, BlockIOError, FileTier
from kvtier.tiers.files.options import SlabOptions
from kvtier.tiers.files.slab_log import LogTail, SlabLog
from kvtier.tiers.io import batch as _short
from kvtier.tiers.io.backends import IOOp, UringIO, run_inline
from kvtier.tiers.io.batch import WriteOp, buffer_address, seed_of
from kvtier.tiers.io.buffers import PAGE, align_up, aligned_array

SUFFIX = ".slab"
CLEAN = ".clean"
SEQ_AT = HEADER_SIZE - 8  # the write sequence number, in the header's reserved padding
GROW_BYTES = 64 << 20  # the most a slab file grows by at once
GROW_PARTS = 16  # ... and at most this fraction of the tier's size
TOUCH_BYTES = 8 << 20  # the zeros a reservation writes at a time
_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_libc = ctypes.CDLL(None, use_errno=True)


class _File:
    """One slab file: ``slots`` slots of ``slot_size`` bytes (own: this writer's, locked)."""

    def __init__(self, path: str, slot_size: int, fd: int, own: bool):
        self.path = path
        self.slot_size = slot_size
        self.fd = fd
        self.own = own
        self.slots = os.fstat(fd).st_size // slot_size
        # heaps (lowest slot first, so a burst of writes runs through the file in order):
        self.free: list[int] = []  # own slots without a block whose bytes count
        self.hollow: list[int] = []  # own slots without a block or counted bytes
        self.sig: tuple[int, int] = (-1, -1)  # (size, mtime) when last scanned (foreign files)
        self.scanned = 0.0
        # own files append what they publish and vacate to their log; foreign ones follow it
        self.log: SlabLog | None = SlabLog(path, self.vacant) if own else None
        self.tail: LogTail | None = None if own else LogTail(path)
        self.listed: dict[int, bytes] = {}  # foreign files: slot → the key listed from it

    def vacant(self) -> list[int]:
        """Own slots that hold no block."""
        return [*self.free, *self.hollow]

    def close(self) -> None:
        """Close the file and its log (for an own file this releases the lock)."""
        for end in (self.log, self.tail):
            if end is not None:
                end.close()
        os.close(self.fd)


def coded_size_class(size: int) -> int:
    """The slot size a coded block of ``size`` bytes (whole pages) is stored in: rounded up to
    one of 64 to 128 steps per doubling, so blocks whose coded sizes differ a little share slot
    files and reuse each other's slots, and the rounding costs under 1/64 of the size."""
    pages = size // PAGE
    step = 1 << max(0, pages.bit_length() - 7)
    return -(-pages // step) * step * PAGE


@dataclass(slots=True, eq=False)
class _Entry:
    """Where a block lives and what its header is (compared byte for byte on every read)."""

    file: _File
    slot: int
    head: bytes  # the 128 header bytes as stored
    header: BlockHeader
    seed: xxhash.xxh3_64  # xxh3 state after the header with its checksum field zeroed
    seq: int

    @property
    def offset(self) -> int:
        return self.slot * self.file.slot_size


#: Another writer's file and what changed in it: slot → the block there now (None: none).
_Changes = tuple[_File, dict[int, "_Entry | None"]]


@dataclass(slots=True)
class _Read:
    key: bytes
    entry: _Entry
    target: memoryview
    scratch: np.ndarray
    fast: bool  # header page, payload pages into the caller's buffer, tail page
    op: IOOp


@dataclass(slots=True)
class _Write:
    key: bytes
    entry: _Entry
    scratch: np.ndarray
    op: IOOp
    value: float


class SlabTier(FileTier):
    """Blocks in fixed-size slots of a few slab files, bounded by ``capacity`` bytes."""

    scheme = "slab"
    options = SlabOptions
    layout = "file"
    pool_per_depth = 4
    default_name = "slab"

    def __init__(
        self,
        namespace: bytes,
        directory: str | os.PathLike,
        capacity: int,
        slot: int = 0,
        *,
        rescan: float = 0.05,
        rescan_full: float = 2.0,
        **common: Any,
    ):
        """``common``: the options of every file tier (see :class:`FileTier`)."""
        if slot < 0:
            raise ConfigError(f"slab slot size must be positive, got {slot}")
        if 0 < capacity < slot:
            raise ConfigError(
                f"slab:// slot={slot} bytes is larger than size={capacity}: no block would fit"
            )
        for label, seconds in (("rescan", rescan), ("rescan_full", rescan_full)):
            if not math.isfinite(seconds) or seconds < 0:
                raise ConfigError(f"slab:// {label}={seconds!r}: use a number of seconds >= 0")
        super().__init__(namespace, directory, capacity, **common)
        self.min_slot = align_up(slot) if slot else 0
        self.rescan_s = rescan
        self.rescan_full_s = rescan_full
        self.writer = secrets.token_hex(6)
        self._rescan_lock = threading.Lock()
        self._classes: dict[int, list[_File]] = {}  # own files by slot size
        self._foreign: dict[str, _File] = {}
        self._seq = 0
        self._last_rescan = 0.0
        self._zero = self._pool.take(PAGE)
        self._zero[:] = 0
        self._closed = False
        self._open_files()
        self._notify_evictions()

    # --- setup -------------------------------------------------------------------------------
    def _open_files(self) -> None:
        """Adopt unlocked files, read the others, rebuild the index, evict to fit."""
        found: list[tuple[int, bytes, _Entry]] = []
        foreign: list[_Changes] = []
        now = time.monotonic()
        for path, slot_size in _slab_files(self.root):
            try:
                fd = os.open(path, self._rw_flags())
            except OSError:
                continue
            if _try_lock(fd):
                f = _File(path, slot_size, fd, own=True)
                clean = os.path.exists(path + CLEAN)
                _unlink(path + CLEAN)  # ours now: unclean until we close it
                self._classes.setdefault(slot_size, []).append(f)
                found += self._scan(f, verify=not clean)
            else:
                os.close(fd)
                f = self._open_foreign(path, slot_size)
                changes = None if f is None else self._changes(f, now, scan=True)
                if changes is not None:
                    foreign.append(changes)
        found.sort(key=lambda t: t[0])  # oldest first: newest of a key wins, LRU order
        ledger = self.ledger
        with self._lock:
            for seq, key, entry in found:
                self._seq = max(self._seq, seq)
                old = ledger.adopt(key, entry, entry.file.slot_size, entry.header.meta.value)
                if old is not None:
                    self._drop(key, *old)
            self._list_locked(foreign)
            ledger.shrink(self._drop, reclaim=self._reclaim_locked)

    def _open_foreign(self, path: str, slot_size: int) -> _File | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | self._oflags)
        except OSError:
            return None
        f = _File(path, slot_size, fd, own=False)
        self._foreign[path] = f
        return f

    def _scan(self, f: _File, verify: bool) -> list[tuple[int, bytes, _Entry]]:
        """Valid blocks of a file as (seq, key, entry); own invalid slots become free room.

        ``verify``: check every block's checksum too (a file whose writer died)."""
        out: list[tuple[int, bytes, _Entry]] = []
        size = f.slot_size
        if f.tail is not None:  # from here on, the log tells what the scan did not see
            f.tail.mark()
        buf = self._pool.take(size if verify else PAGE)
        view = memoryview(buf)[: size if verify else PAGE]
        hollow: list[int] = []
        try:
            for s in range(f.slots):
                try:
                    n = os.preadv(f.fd, [view], s * size)
                except OSError:
                    n = 0
                entry = None
                if n >= HEADER_SIZE:
                    entry = self._entry_of(f, s, bytes(buf[:HEADER_SIZE]))
                if entry is not None and verify:
                    stored = entry.header.stored_len
                    h = entry.seed.copy()
                    h.update(buf[PAGE : PAGE + stored])
                    if n < PAGE + stored or h.intdigest() != entry.header.checksum:
                        entry = None
                if entry is None:
                    hollow.append(s)
                else:
                    out.append((entry.seq, entry.header.key, entry))
        finally:
            self._pool.give(buf)
        if f.own:
            with self._lock:
                f.hollow.extend(hollow)
                heapq.heapify(f.hollow)
        return out

    def _entry_of(self, f: _File, slot: int, head: bytes) -> _Entry | None:
        """The index entry of a slot whose header bytes are ``head``; None if not a block."""
        try:
            header = parse_header(head, self.namespace)
        except BlockError:
            return None
        if PAGE + align_up(header.stored_len) > f.slot_size:
            return None
        seq = int.from_bytes(head[SEQ_AT:HEADER_SIZE], "little")
        return _Entry(f, slot, head, header, seed_of(head), seq)

    # --- verbs -------------------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is held here or listed from another writer; the other writers'
        changes are followed first (rate-limited), so a block they evicted is not promised."""
        self._rescan()
        index = self._index
        return [k in index for k in keys]

    def get_many_into(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        results: list[BlockHeader | BlockError | None] = self._results(keys, outs)
        if not keys:
            return results
        if any(k not in self._index for k in keys):
            self._rescan(force=True)  # a reader was promised them: another writer's, new
        todo: Sequence[int] = self._ring_reads(keys, outs, results)
        self._batch(
            todo,
            lambda i: self._plan_read(keys[i], outs[i], rescan=False),
            self._finish_read,
            results,
            inline=False,
            decodes=self._any_coded(keys, todo),
        )
        return results

    def _any_coded(self, keys: Sequence[bytes], todo: Sequence[int]) -> bool:
        """Whether any of the blocks ``todo`` names is stored coded (it is decoded after its
        read), as far as the index knows."""
        index = self._index
        for i in todo:
            entry = index.get(keys[i])
            if entry is not None and entry.header.meta.codec != "raw":
                return True
        return False

    def put_many(self, items: Sequence[tuple[bytes, object, BlockMeta]]) -> list[bool]:
        items = self._coded_items(items)
        results = [False] * len(items)
        if not items:
            return results
        try:
            todo = self._ring_writes(items, results)
            self._write_batch(items, todo, self._plan_write, self._publish, results, inline=False)
        finally:
            self._notify_evictions()
        return results

    def delete(self, key: bytes) -> bool:
        with self._lock:
            gone = self.ledger.pop(key)
            if gone is None:
                return False
            entry, size = gone
            if not entry.file.own:
                return True  # another writer's block: forgotten here (found again on rescan)
        # the slot is nobody's until freed below: no write can land in it meanwhile; if this
        # fails, the block may come back on reopen (its checks still hold)
        with contextlib.suppress(OSError):
            os.pwritev(entry.file.fd, [self._zero], entry.offset)
        with self._lock:  # counted as held until now: used + kept never exceeds the limit
            self._drop(key, entry, size)
        return True

    @property
    def file_bytes(self) -> int:
        """Bytes of this writer's slab files (slots of every state, growth chunks included)."""
        with self._lock:
            return sum(f.slots * f.slot_size for fs in self._classes.values() for f in fs)

    def _footprint_locked(self) -> int:
        total = 0
        for files in self._classes.values():
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.fstat(f.fd).st_blocks * 512
        return total

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.io.close()
        self._decoders.close()
        with self._lock:
            for files in self._classes.values():
                for f in files:
                    with contextlib.suppress(OSError):
                        Path(f.path + CLEAN).touch()
                    f.close()  # releases the lock
            for f in self._foreign.values():
                f.close()
            self._classes.clear()
            self._foreign.clear()
            self.ledger.clear()
        self._pool.clear()

    # --- internals: reads --------------------------------------------------------------------
    def _plan_read(self, key: bytes, out, rescan: bool = True) -> tuple[_Read, IOOp] | None:
        entry = self._index.get(key)
        if entry is None and rescan and self._rescan():
            entry = self._index.get(key)
        if entry is None:
            return None
        header = entry.header
        target = memoryview(out).cast("B")
        if target.nbytes < header.raw_len:
            raise BufferTooSmallError(
                f"buffer of {target.nbytes} bytes cannot hold a {header.raw_len}-byte block"
            )
        stored = header.stored_len
        bulk = stored // PAGE * PAGE
        raw = header.meta.codec == "raw"
        if raw and (buffer_address(out, stored, writable=True) or (not self.direct and bulk)):
            scratch = self._pool.take(2 * PAGE)
            bufs = [scratch[:PAGE]]
            if bulk:
                bufs.append(target[:bulk])
            if stored > bulk:
                bufs.append(scratch[PAGE : 2 * PAGE])
            fast = True
        else:
            n = PAGE + align_up(stored)
            scratch = self._pool.take(n)
            bufs = [scratch[:n]]
            fast = False
        op = IOOp(entry.file.fd, bufs, entry.offset)
        return _Read(key, entry, target, scratch, fast, op), op

    def _finish_read(self, read: _Read, res: int) -> BlockHeader | None:
        entry, scratch = read.entry, read.scratch
        try:
            header = entry.header
            stored = header.stored_len
            bulk = stored // PAGE * PAGE
            expected = PAGE + align_up(stored)
            ok = res == expected and bytes(scratch[:HEADER_SIZE]) == entry.head
            if ok:
                h = entry.seed.copy()
                if read.fast:
                    if bulk:
                        h.update(read.target[:bulk])
                    tail = scratch[PAGE : PAGE + stored - bulk]
                    h.update(tail)
                    ok = h.intdigest() == header.checksum
                    if ok and stored > bulk:
                        read.target[bulk:stored] = tail
                else:
                    body = scratch[PAGE : PAGE + stored]
                    h.update(body)
                    ok = h.intdigest() == header.checksum
                    if ok:
                        codec = get_codec(header.meta.codec)
                        n = codec.decode_into(
                            memoryview(body),
                            memoryview(read.target).cast("B")[: header.raw_len],
                            header.meta.dtype,
                        )
                        if n != header.raw_len:
                            raise CorruptBlockError(
                                f"block decoded to {n} bytes, header says {header.raw_len}"
                            )
            with self._lock:
                current = self._index.get(read.key) is entry
                if ok:
                    if current and entry.file.own:
                        self.ledger.touch(read.key)
                    return header
                if not current:
                    return None  # the block left (or moved) while it was read: a miss
                if not entry.file.own:
                    self.ledger.pop(read.key)  # its writer reused the slot: a miss
                    return None
            raise self._read_error(read, res, expected)
        finally:
            self._pool.give(scratch)

    def _read_error(self, read: _Read, res: int, expected: int) -> BlockError:
        """The precise error of a read of this writer's block that failed its checks."""
        if res < 0:
            return BlockIOError(f"reading block {read.key.hex()}: {os.strerror(-res)}")
        if res < HEADER_SIZE:
            return CorruptBlockError(f"block truncated: {res} bytes of its slot were readable")
        try:
            header = parse_header(bytes(read.scratch[:HEADER_SIZE]), self.namespace, read.key)
        except BlockError as exc:
            return exc
        if res < expected:
            return CorruptBlockError(f"block truncated: {res} of {expected} bytes")
        if header != read.entry.header:
            return CorruptBlockError("block header does not match the one this tier wrote")
        return CorruptBlockError("block checksum mismatch")

    def _read_victim(self, key: bytes, entry: _Entry) -> tuple[np.ndarray, BlockHeader] | None:
        out = np.empty(entry.header.raw_len, np.uint8)
        planned = self._plan_read(key, out, rescan=False)
        if planned is None or self._finish_read(planned[0], run_inline(planned[1])) is None:
            return None
        return out, entry.header

    def refresh(self) -> bool:
        """Follow the other writers' files now (see :meth:`_rescan`)."""
        return self._rescan(force=True)

    def _rescan(self, force: bool = False) -> bool:
        """Bring the listing of other writers' blocks up to date, the blocks they added and
        those that left (rate-limited; ``force``: now, for a read of blocks a lookup promised,
        waiting for a rescan under way and running again unless one began after the call);
        True if the listing is that fresh."""
        now = time.monotonic()
        if self._closed or (not force and now - self._last_rescan < self.rescan_s):
            return False
        if not self._rescan_lock.acquire(blocking=force):
            return False
        if force and self._last_rescan >= now:  # another thread's rescan began after the call
            self._rescan_lock.release()
            return True
        now = time.monotonic()
        try:
            self._last_rescan = now
            with self._lock:
                own = {f.path for fs in self._classes.values() for f in fs}
            changed: list[_Changes] = []
            for path, slot_size in _slab_files(self.root):
                if path in own:
                    continue
                f = self._foreign.get(path)
                if f is None:  # a new file: its log may have restarted since some blocks
                    f = self._open_foreign(path, slot_size)
                    changes = None if f is None else self._changes(f, now, scan=True)
                else:
                    changes = self._changes(f, now)
                if changes is not None:
                    changed.append(changes)
            with self._lock:
                self._list_locked(changed)
            return True
        finally:
            self._rescan_lock.release()

    def _changes(self, f: _File, now: float, scan: bool = False) -> _Changes | None:
        """What changed in another writer's file since the last look: each slot whose block
        changed, with its block now (None: it holds none). From the log where it can be
        followed; else (or with ``scan``) from a scan of every slot (rate-limited by
        ``rescan_full`` when the file did not change), which lists everything, then the log
        from its start, which tells which of the blocks still in their slots have left them."""
        try:
            st = os.fstat(f.fd)
        except OSError:
            return None
        f.slots = max(f.slots, st.st_size // f.slot_size)
        logged = None if scan else self._logged(f)
        if logged is not None:
            return f, logged
        sig = (st.st_size, st.st_mtime_ns)
        if not scan and sig == f.sig and now - f.scanned < self.rescan_full_s:
            return None
        f.sig, f.scanned, f.slots = sig, now, st.st_size // f.slot_size
        slots: dict[int, _Entry | None] = dict.fromkeys(f.listed)  # gone unless found again
        slots.update((entry.slot, entry) for _, _, entry in self._scan(f, verify=False))
        slots.update(self._logged(f) or {})
        return f, slots

    def _logged(self, f: _File) -> dict[int, _Entry | None] | None:
        """Slot → block (None: vacated) from the records ``f``'s writer logged since the last
        look, the last record of a slot winning (only that one's header is parsed); None when
        the log cannot be followed."""
        records = f.tail.new() if f.tail is not None else None
        if records is None:
            return None
        last = dict(records)
        return {
            slot: self._entry_of(f, slot, head) if head is not None and slot < f.slots else None
            for slot, head in last.items()
        }

    def _list_locked(self, changed: Sequence[_Changes]) -> None:
        """Apply other writers' changes to the index: a key listed from a slot that changed is
        forgotten (if the index still points there), then the blocks now in those slots are
        listed, oldest first, unless this writer or a newer copy holds the key."""
        index = self._index
        shown: list[_Entry] = []
        for f, slots in changed:
            for slot, entry in slots.items():
                old = f.listed.pop(slot, None)
                cur = index.get(old) if old is not None else None
                if cur is not None and cur.file is f and cur.slot == slot:
                    self.ledger.pop(old)
                if entry is not None:
                    shown.append(entry)
        shown.sort(key=lambda e: e.seq)
        for entry in shown:
            key = entry.header.key
            cur = index.get(key)
            if cur is None or (not cur.file.own and cur.seq <= entry.seq):
                self.ledger.show(key, entry)
                entry.file.listed[entry.slot] = key

    # --- internals: writes -------------------------------------------------------------------
    def _prepare_block(
        self, key: bytes, payload, meta: BlockMeta, encoded: Encoded | None = None
    ) -> tuple[_Entry, memoryview] | None:
        """Admit, encode (unless ``encoded`` is its encode_payload) and place a block: its
        index entry-to-be (header, slot) and stored bytes; None when not admitted or there is
        no room."""
        raw = memoryview(payload).cast("B")
        codec_id, meta, stored = encoded if encoded is not None else encode_payload(raw, meta)
        n = stored.nbytes
        with self._lock:
            if not self.ledger.admit(key, n, meta.value):
                return None
            place = self._take_slot(self._slot_size(n, coded=bool(codec_id)))
            if place is None:
                return None
            self._seq = seq = max(self._seq + 1, time.time_ns())
        zeroed = header_bytes(self.namespace, key, meta, codec_id, raw.nbytes, n, 0)
        head, checksum, seed = _short.seal(zeroed[:SEQ_AT] + seq.to_bytes(8, "little"), stored)
        header = BlockHeader(self.namespace, key, meta, raw.nbytes, n, checksum)
        return _Entry(place[0], place[1], head, header, seed, seq), stored

    def _slot_size(self, stored: int, coded: bool) -> int:
        """The slot size (the file class) a block of ``stored`` bytes goes to."""
        size = PAGE + align_up(stored)
        if coded:  # coded sizes vary block to block: a few classes, not one per size
            size = coded_size_class(size)
        return max(self.min_slot, size)

    def _plan_write(
        self, key: bytes, payload, meta: BlockMeta, encoded: Encoded | None = None
    ) -> tuple[_Write, IOOp] | None:
        planned = self._prepare_block(key, payload, meta, encoded)
        if planned is None:
            return None
        entry, stored = planned
        head, n = entry.head, stored.nbytes
        bulk = n // PAGE * PAGE
        direct_ok = not self.direct or buffer_address(stored, 0, writable=False)
        if direct_ok:
            scratch = self._pool.take(2 * PAGE)
            scratch[:HEADER_SIZE] = np.frombuffer(head, np.uint8)
            scratch[HEADER_SIZE:PAGE] = 0
            bufs = [scratch[:PAGE]]
            if bulk:
                bufs.append(stored[:bulk])
            if n > bulk:
                tail = scratch[PAGE : 2 * PAGE]
                tail[: n - bulk] = np.frombuffer(stored[bulk:], np.uint8)
                tail[n - bulk :] = 0
                bufs.append(tail)
        else:  # an unaligned payload under O_DIRECT: one copy into an aligned buffer
            total = PAGE + align_up(n)
            scratch = self._pool.take(total)
            scratch[:HEADER_SIZE] = np.frombuffer(head, np.uint8)
            scratch[HEADER_SIZE:PAGE] = 0
            scratch[PAGE : PAGE + n] = np.frombuffer(stored, np.uint8)
            scratch[PAGE + n : total] = 0
            bufs = [scratch[:total]]
        op = IOOp(entry.file.fd, bufs, entry.offset, write=True)
        return _Write(key, entry, scratch, op, meta.value), op

    def _take_slot(self, size: int) -> tuple[_File, int] | None:
        """A slot of ``size`` bytes for a write, evicting as needed; None when there is no room."""
        with self._lock:
            ok, place = self._make_room_locked(size)
            if ok and place is None:
                place = self._fresh_slot(size)
                if place is None:
                    self.ledger.release(size)
            return place if ok else None

    def _reuse_locked(self, size: int) -> tuple[_File, int] | None:
        for f in self._classes.get(size, ()):
            if f.free:
                return f, heapq.heappop(f.free)
        return None

    def reserve(self, block_bytes: int, touch: bool = False) -> int:
        """Grow this writer's file of raw blocks of ``block_bytes`` to the tier's size now, so
        that no later write grows it; ``touch`` also writes the new room once (zeros): on tmpfs
        a page is allocated and zeroed on its first write, in the writing thread, whatever
        ``fallocate`` did. The bytes added (0 for a coded tier, whose blocks' sizes vary, or
        when the filesystem has no room: growth then happens write by write)."""
        if self.codec != "raw" or block_bytes <= 0:
            return 0
        size = self._slot_size(block_bytes, coded=False)
        with self._lock:
            files = self._class_files_locked(size)
            if files is None:
                return 0
            f = files[0]
            grow = (self.capacity - self.file_bytes) // size
            if grow <= 0:
                return 0
            try:
                os.posix_fallocate(f.fd, f.slots * size, grow * size)
            except OSError as exc:
                if exc.errno in NOSPACE:
                    self._note(f"no room to reserve size= at open ({exc.strerror})")
                    return 0
                raise
            if touch:
                zeros = aligned_array(min(grow * size, TOUCH_BYTES))
                zeros[:] = 0
                end = (f.slots + grow) * size
                for offset in range(f.slots * size, end, zeros.nbytes):
                    os.pwrite(f.fd, zeros[: min(zeros.nbytes, end - offset)], offset)
            first = f.slots
            f.slots += grow
            f.hollow.extend(range(first, first + grow))  # all above the file's slots: a heap
            return grow * size

    def _class_files_locked(self, size: int) -> list[_File] | None:
        """This writer's files of slot ``size`` (one created if none); None when the
        filesystem has no inode left."""
        files = self._classes.get(size)
        if files is None:
            path = str(self.root / f"{self.writer}-{size}{SUFFIX}")
            try:
                fd = os.open(path, self._rw_flags() | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as exc:
                if exc.errno in NOSPACE:  # no inode left for the file
                    self._out_of_space()
                    return None
                raise
            _try_lock(fd)
            files = self._classes[size] = [_File(path, size, fd, own=True)]
        return files

    def _fresh_slot(self, size: int) -> tuple[_File, int] | None:
        """A never-used (or punched) slot of ``size`` bytes; grows or creates a file."""
        files = self._class_files_locked(size)
        if files is None:
            return None
        for f in files:
            if f.hollow:
                return f, heapq.heappop(f.hollow)
        f = files[0]
        grow = self._growth(size)
        try:
            os.posix_fallocate(f.fd, f.slots * size, grow * size)
        except OSError as exc:
            if exc.errno in NOSPACE:
                grow = 1  # no room to preallocate: the write itself may still fit
        first = f.slots
        f.slots += grow
        f.hollow.extend(range(first + 1, first + grow))  # sorted: still a heap
        return f, first

    def _growth(self, size: int) -> int:
        """Slots a file of class ``size`` grows by: a chunk scaled to the tier's size, never
        past what keeps the slab files' bytes near ``size=`` (preallocated slots count)."""
        chunk = min(GROW_BYTES, max(self.capacity // GROW_PARTS, size))
        room = max(self.capacity - self.file_bytes, size)
        return max(1, min(chunk, room) // size)

    def _reclaim_locked(self) -> int:
        """Give the bytes of one free slot back to the filesystem (it becomes hollow)."""
        for files in self._classes.values():
            for f in files:
                if f.free:
                    slot = heapq.heappop(f.free)
                    size = f.slot_size
                    heapq.heappush(f.hollow, slot)
                    ret = _libc.fallocate(
                        f.fd, _PUNCH, ctypes.c_long(slot * size), ctypes.c_long(size)
                    )
                    if ret != 0:
                        self._note(
                            "this filesystem cannot punch holes: slab files keep the room of "
                            "freed slots of other sizes (not counted against the capacity)"
                        )
                    return size
        return 0

    def _publish(self, write: _Write, res: int) -> bool:
        """Index a written block (``res``: bytes written or ``-errno``); a failed write gives
        its slot back."""
        self._pool.give(write.scratch)
        expected = sum(memoryview(b).nbytes for b in write.op.bufs)
        return self._commit(write.key, write.entry, res, expected, write.value)

    def _commit(self, key: bytes, entry: _Entry, res: int, expected: int, value: float) -> bool:
        size = entry.file.slot_size
        with self._lock:
            if res != expected:
                if res < 0 and -res in NOSPACE:  # the slot's room is not on the disk: hollow
                    self.ledger.release(size)
                    heapq.heappush(entry.file.hollow, entry.slot)
                else:
                    self._drop(key, entry, size)
                return self._write_failed(key, res)
            old = self.ledger.add(key, entry, size, value)
            if old is not None:
                self._drop(key, *old)
            if entry.file.log is not None:
                entry.file.log.append(entry.slot, entry.head, entry.file.slots)
        return True

    # --- internals: the io_uring batch path --------------------------------------------------
    def _ring_write_op(
        self, key: bytes, stored: memoryview, meta: BlockMeta, addr: int
    ) -> tuple[WriteOp, tuple[_Entry, float, int]] | None:
        planned = self._prepare_block(key, stored, meta)
        if planned is None:
            return None
        entry, stored = planned
        op = WriteOp(entry.file.fd, entry.head, stored, addr, entry.offset)
        return op, (entry, meta.value, PAGE + align_up(stored.nbytes))

    def _ring_written(self, key: bytes, state: tuple[_Entry, float, int], res: int) -> bool:
        entry, value, expected = state
        return self._commit(key, entry, res, expected, value)

    def _ring_reads(self, keys: Sequence[bytes], outs: Sequence, results: list) -> list[int]:
        """Read indexed raw blocks into page-aligned caller buffers through the ring batch
        path (``io.batch``); the indices left to the general path (other buffers, other
        codecs, failed checks of this writer's blocks: the general path reads them again and
        raises the precise error). A failed check of another writer's block is a miss."""
        if not isinstance(self.io, UringIO):
            return list(range(len(keys)))
        todo: list[int] = []
        entries: list[_Entry] = []
        rest: list[int] = []
        index = self._index
        for i, key in enumerate(keys):
            entry = index.get(key)
            if entry is None:
                continue  # a miss
            if entry.header.meta.codec == "raw" and buffer_address(
                outs[i], entry.header.stored_len, writable=True
            ):
                todo.append(i)
                entries.append(entry)
            else:
                rest.append(i)
        if not todo:
            return rest
        served: list[int] = []
        sub: list = [None] * len(todo)

        def locate(j: int) -> tuple[int, int]:
            return entries[j].file.fd, entries[j].offset

        with self._ring_slots() as slots:
            redo = _short.read_known(
                slots, locate, entries, [outs[i] for i in todo], sub, served, close=False
            )
        with self._lock:
            for j in served:
                results[todo[j]] = sub[j]
                if entries[j].file.own:
                    self.ledger.touch(keys[todo[j]])
            for j in redo:
                i, entry = todo[j], entries[j]
                if index.get(keys[i]) is not entry:
                    continue  # it left (or moved) while it was read: a miss
                if entry.file.own:
                    rest.append(i)
                else:
                    self.ledger.pop(keys[i])  # its writer reused the slot: a miss
        rest.sort()
        return rest

    # --- internals: leaving blocks -----------------------------------------------------------
    def _drop(self, key: bytes, entry: _Entry, size: int) -> None:
        """A block left the books: an own slot becomes free room (still counted, reusable), and
        the log says so (the block's bytes stay in the slot, and a reader must not list it)."""
        f = entry.file
        if f.own:
            self.ledger.release(size)
            heapq.heappush(f.free, entry.slot)
            self.ledger.keep(size)
            if f.log is not None:
                f.log.vacate(entry.slot, f.slots)


# --- helpers -----------------------------------------------------------------------------------
def _slab_files(root: Path) -> list[tuple[str, int]]:
    """(path, slot size) of the slab files in a namespace folder, by name."""
    out: list[tuple[str, int]] = []
    try:
        with os.scandir(root) as it:
            names = sorted(e.name for e in it if e.name.endswith(SUFFIX))
    except FileNotFoundError:
        return out
    for name in names:
        _, _, size = name[: -len(SUFFIX)].rpartition("-")
        if size.isdigit() and int(size) >= PAGE and int(size) % PAGE == 0:
            out.append((str(root / name), int(size)))
    return out


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


SlabIOError = BlockIOError  # the name this tier's read errors had

__all__ = ["SlabIOError", "SlabTier"]
