"""Local-disk tier in slab files: fixed-size slots in a few files, one positional op per block.

Layout: ``<dir>/<namespace hex>/<writer id>-<slot bytes>.slab``. A slot is a header page and the
payload in whole pages; its size (its *class*) is that of the first block written into it
(``PAGE + payload rounded up to pages``), or at least ``slot=`` when given, so blocks of one
shape share one file per writer and a block of another size gets its own class (its own file).
A write is one ``pwritev`` (io_uring or threads, ``depth`` in flight) of
``[header page][payload pages straight from the caller's buffer][tail page]`` at a free slot's
offset: no open, rename or lease per block. Files are opened once (O_DIRECT, buffered with a
note where the filesystem refuses it) and grow by preallocated chunks (``posix_fallocate``).

Publication is by checksum: the 128-byte header (``kvtier.codec``: magic, namespace, key,
lengths, xxh3 over header and payload) carries a write sequence number in its reserved padding
(bytes 120-127, covered by the checksum, ignored by other readers of the format), so a torn
write never validates and the newest of two blocks of one key wins. A write never lands in a
slot the index points to: an overwrite takes a fresh slot and frees the old one once the new
block is published; a read whose check fails on a slot that left the index meanwhile is a miss,
never data and never an error. ``delete`` zeroes the slot's header page on disk (so a deleted
block does not come back on reopen); evicted slots are reused without a write of their own.

Writers: each process writes only the files it holds an exclusive ``flock`` on: the files it
creates (named by a writer id drawn at open) and the files of dead writers it adopts at open
(unlocked files). A file closed cleanly leaves a ``.clean`` marker; a file adopted without one
(its writer died) has every slot's checksum verified on open, so a torn block is never indexed.
On open the index is rebuilt from the slot headers of every file (invalid slots are free).
Files other live processes write are read-only here: on a miss (``contains``/``get``) they are
rescanned (files whose size or mtime changed, or every ``rescan_full`` seconds), at most once
per ``rescan`` seconds; such blocks are served after the same checks and listed by
``iter_keys``/``usage().blocks``, but never evicted here nor counted in ``used_bytes`` (they
are their writer's), and a failed check on them is a miss (their writer may have reused the
slot); ``delete`` of one only forgets it here until the next rescan.

Capacity: bytes of this writer's slots holding blocks (``usage().used_bytes``) plus freed
slots still holding bytes stay within ``size``; to make room a put reuses a free slot of its
class, else takes a new one while there is room, else punches out a free slot of another class
(``fallocate(PUNCH_HOLE)``), else evicts (``eviction=``). File growth chunks (at most 64 MiB of
never-written slots per class) are not counted. ``admit_after=N`` admits a key on its N-th put.
Free slots are handed out lowest first, so a burst of writes runs through a file in order.
Evicted blocks keep their bytes until the slot is reused and may be indexed again on reopen
(whole, valid blocks; the newest of a key wins).

Errors: a block of this writer that fails its checks raises a ``BlockError``
(``CorruptBlockError``, ``ForeignBlockError``, ``SlabIOError``) on every read until it is
deleted; the cache counts it as a miss and deletes it, which frees the slot.

I/O: ``io=uring`` (the default where io_uring can be set up, else ``threads``). Batches on the
ring take a short path: ``_short``'s scratch slots (a header and a tail page per op, kept with
the ring), each op at its slot's offset and handed to the kernel as soon as it is prepared
while the ring has room; reads of raw blocks into page-aligned buffers compare the 128 header
bytes with the indexed ones and hash the payload from a seeded xxh3. Payloads move through the
ring's staging (``_short.Staging``: ``staging=`` bytes a ring, 96 MiB by default, on
transparent huge pages mapped on first use) while it has a free buffer: the device then reads
or writes one physically contiguous range per 2 MiB instead of a page list (65 segments for
256 KiB from a caller's 4 KiB pages, ~1,440 for 5.6 MiB), which on the dev VM's virtio disk is
most of the cost of an op. A read is checked in staging before it is copied into the caller's
buffer; a write is copied in (~20 us per 256 KiB) before it is queued. Measured (``kvtier bench
storage``, depths 1/4/16): 256 KiB reads 0.77/0.84x fio at depths 1/4 before, 1.36/1.35/1.65x
after; 5.6 MiB (payloads over 1 MiB were not staged at first) writes 0.88/0.80/0.82x unstaged
against 1.20/1.14/1.06x staged, reads 1.12/1.11/1.00x against 2.27/2.08/1.52x (``staging=0``
and the default, one run). Other codecs,
unaligned buffers and failed checks take the general path (``_io`` backends, pool buffers),
which raises the precise error.

The default disk layout of ``kvtier run``, ``calibrate`` and ``bench`` (``file://`` keeps one
file per block). Against fio on one preallocated file (``kvtier bench storage``: same block
file size, depth, io_uring, O_DIRECT, O_DSYNC; requests of a 32k-token prefix; kvtier and fio
taking turns in 8 slices per pass), two rounds of 3 repeats on the dev VM at 43a8a1d and
6812d1b (virtio disk, ext4, 2 cores, load average 0.8-1.5), depths 1/4/16: 256 KiB write
0.93-1.02/0.98-1.11/1.16x, read 1.35-1.48/1.71-1.72/1.83-1.87x; 1 MiB write
1.28-1.36/1.27-1.32/1.55-1.57x, read 2.05-2.10/1.83-1.85/2.21-2.33x; 5.6 MiB write
1.55/1.26-1.45/1.00-1.23x, read 2.09-2.42/2.07-2.17/1.90-1.96x. fio's buffers are its own
(4 KiB pages); the ratios above 1 are the staging's doing. Requests of 1-4 rounds of the
queue (16 blocks at depth 4) read 0.80-0.83x at depth 4 before the staging: the queue drains
at the end of every request, which fio's never does. The xxh3 of a block that is not in cache
costs ~50 us per 256 KiB (~200 us per MiB) of CPU that fio does not spend.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import heapq
import os
import secrets
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from kvtier.codec import (
    HEADER_SIZE,
    BlockError,
    BlockHeader,
    BlockMeta,
    BufferTooSmallError,
    CorruptBlockError,
    get_codec,
    parse_header,
)
from kvtier.codec.container import RAW_META, _header_bytes
from kvtier.errors import ConfigError
from kvtier.policy.eviction import make_policy
from kvtier.specs import parse_size
from kvtier.tiers._admission import FrequencyAdmission
from kvtier.tiers._options import int_opt, tristate
from kvtier.tiers.base import Tier, TierCapabilities, TierURL, TierUsage
from kvtier.tiers.io import batch as _short
from kvtier.tiers.io import uring as _uring
from kvtier.tiers.io.backends import IOBackend, IOOp, UringIO, make_backend, run_inline
from kvtier.tiers.io.batch import buffer_address, seed_of
from kvtier.tiers.io.buffers import PAGE, BufferPool, address, align_up
from kvtier.tiers.io.direct import O_DIRECT as _O_DIRECT
from kvtier.tiers.io.direct import resolve_direct

SUFFIX = ".slab"
CLEAN = ".clean"
SEQ_AT = HEADER_SIZE - 8  # the write sequence number, in the header's reserved padding
GROW_BYTES = 64 << 20
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DSYNC = getattr(os, "O_DSYNC", 0)
_NOSPACE = (errno.ENOSPC, errno.EDQUOT)
_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_OPTIONS = (
    "size",
    "slot",
    "eviction",
    "admit_after",
    "io",
    "depth",
    "staging",
    "direct",
    "sync",
    "rescan",
    "name",
)
_libc = ctypes.CDLL(None, use_errno=True)


class SlabIOError(BlockError):
    """The device failed to read a block (EIO …): served as a miss, like a damaged block."""


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


_SLOT = _short.SLOT  # ring scratch per op: a header page and a tail page


class _Slots(_short.Slots):
    """``_short``'s ring scratch slots, each op at its own file offset (a slot of a slab)."""

    def prepare_at(
        self, i: int, slot: int, opcode: int, fd: int, addr: int, nbytes: int, tail: bool, at: int
    ) -> None:
        """``prepare`` an op at file offset ``at``."""
        self.prepare(i, slot, opcode, fd, addr, nbytes, tail)
        self.ready.append((*self.ready.pop(), at))

    def _queue_ready(self) -> None:
        ring, ready, depth = self.ring, self.ready, self.depth
        while ready and ring.pending < depth:
            opcode, fd, iov, count, i, at = ready.popleft()
            ring.queue(opcode, fd, iov, count, at, i)


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


class SlabTier(Tier):
    """Blocks in fixed-size slots of a few slab files, bounded by ``capacity`` bytes."""

    scheme = "slab"
    capabilities = TierCapabilities(persistent=True, shared=False, verifies_checksum=True)
    align = PAGE

    def __init__(
        self,
        namespace: bytes,
        directory: str | os.PathLike,
        capacity: int,
        *,
        slot: int = 0,
        eviction: str = "lru",
        admit_after: int = 1,
        io: str = "auto",
        depth: int = 8,
        staging: int = _short.STAGING_BUDGET,
        direct: bool | None = None,
        sync: bool = True,
        rescan: float = 0.05,
        rescan_full: float = 2.0,
        name: str | None = None,
    ):
        super().__init__(namespace, name or "slab")
        if capacity <= 0:
            raise ConfigError(f"slab tier capacity must be positive, got {capacity}")
        if slot < 0:
            raise ConfigError(f"slab slot size must be positive, got {slot}")
        self.directory = Path(directory)
        self.root = self.directory / namespace.hex()
        self.capacity = capacity
        self.min_slot = align_up(slot) if slot else 0
        self.sync = sync
        self.rescan_s = rescan
        self.rescan_full_s = rescan_full
        self.notes: list[str] = []
        self.writer = secrets.token_hex(6)
        self._lock = threading.RLock()
        self._rescan_lock = threading.Lock()
        self._admission = FrequencyAdmission(admit_after)
        self.admit_after = admit_after
        self._policy = make_policy(eviction)
        self._index: dict[bytes, _Entry] = {}
        self._classes: dict[int, list[_File]] = {}  # own files by slot size
        self._foreign: dict[str, _File] = {}
        self._used = 0  # own slots holding blocks, plus writes in flight
        self._free_bytes = 0  # own free slots whose bytes count against the capacity
        self._seq = 0
        self._last_rescan = 0.0
        self._pool = BufferPool(keep=4 * depth + 4)
        self.root.mkdir(parents=True, exist_ok=True)
        self.direct, refusal = resolve_direct(direct, self.root, str(self.directory))
        if refusal:
            self._note(refusal)
        self._oflags = _O_CLOEXEC | (_O_DIRECT if self.direct else 0)
        self._zero = self._pool.take(PAGE)
        self._zero[:] = 0
        if staging < 0:
            raise ConfigError(f"slab tier staging budget must be 0 or more, got {staging}")
        self.staging = staging
        self.io: IOBackend = make_backend(io, depth)
        self.ioengine = self.io.ioengine
        self._closed = False
        self._notify_evicted_many(self._open_files())

    @classmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> SlabTier:
        """``slab:///path?size=200GiB[&slot=260KiB][&eviction=lru|arc|cost][&admit_after=N]
        [&io=threads|uring|auto][&depth=N][&staging=96MiB][&direct=auto|1|0][&sync=1|0]
        [&rescan=seconds]``."""
        opts = url.options
        if url.netloc not in ("", "localhost"):
            raise ConfigError(f"slab:// tier URL names host {url.netloc!r}; use slab:///abs/path")
        if not url.path or "size" not in opts:
            raise ConfigError(
                "slab:// tier URL needs a directory and a size, e.g. slab:///nvme/kv?size=200GiB"
            )
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown slab:// tier option(s) {unknown}; known: {_OPTIONS}")
        try:
            rescan = float(opts.get("rescan") or 0.05)
        except ValueError:
            raise ConfigError(f"tier option rescan={opts['rescan']!r} is not a number") from None
        return cls(
            namespace,
            url.path,
            parse_size(opts["size"]),
            slot=parse_size(opts["slot"]) if opts.get("slot") else 0,
            eviction=opts.get("eviction", "lru"),
            admit_after=int_opt(opts, "admit_after", 1),
            io=opts.get("io", "auto"),
            depth=int_opt(opts, "depth", 8),
            staging=parse_size(opts.get("staging") or str(_short.STAGING_BUDGET)),
            direct=tristate(opts.get("direct", "auto"), "direct"),
            sync=tristate(opts.get("sync", "1"), "sync") is not False,
            rescan=rescan,
            name=opts.get("name"),
        )

    # --- setup -------------------------------------------------------------------------------
    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            warnings.warn(f"kvtier slab tier: {text}", RuntimeWarning, stacklevel=3)

    def _rw_flags(self) -> int:
        return os.O_RDWR | self._oflags | (_O_DSYNC if self.sync else 0)

    def _open_files(self) -> list[bytes]:
        """Adopt unlocked files, read the others, rebuild the index; returns evicted keys."""
        found: list[tuple[int, bytes, _Entry]] = []
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
                if f is not None:
                    found += self._scan(f, verify=False)
        found.sort(key=lambda t: t[0])  # oldest first: newest of a key wins, LRU order
        evicted: list[bytes] = []
        with self._lock:
            for seq, key, entry in found:
                self._seq = max(self._seq, seq)
                old = self._index.get(key)
                if old is not None and old.file.own:
                    self._drop_locked(key, old)
                self._index[key] = entry
                if entry.file.own:
                    self._used += entry.file.slot_size
                    self._policy.insert(key, entry.file.slot_size, entry.header.meta.value)
            while self._used + self._free_bytes > self.capacity:
                if self._free_bytes:
                    self._punch_locked()
                    continue
                victim = self._policy.victim()
                if victim is None:
                    break
                self._evict_locked(victim, evicted)
        return evicted

    def _open_foreign(self, path: str, slot_size: int) -> _File | None:
        try:
            fd = os.open(path, os.O_RDONLY | self._oflags)
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
        return key in self._index or (self._rescan() and key in self._index)

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        index = self._index
        found = [k in index for k in keys]
        if False in found and self._rescan():
            found = [k in index for k in keys]
        return found

    def get_into(self, key: bytes, out) -> BlockHeader | None:
        read = self._plan_read(key, out)
        if read is None:
            return None
        return self._finish_read(read, run_inline(read.op))

    def get_many_into(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        results: list[BlockHeader | BlockError | None] = [None] * len(keys)
        if not keys:
            return results
        if any(k not in self._index for k in keys):
            self._rescan()
        if isinstance(self.io, UringIO):
            todo: Sequence[int] = self._ring_reads(keys, outs, results)
        else:
            todo = range(len(keys))
        reads: dict[int, _Read] = {}
        errors: list[Exception] = []

        def prepare(j: int) -> IOOp | None:
            i = todo[j]
            try:
                read = self._plan_read(keys[i], outs[i], rescan=False)
            except Exception as exc:
                errors.append(exc)
                return None
            if read is None:
                return None
            reads[j] = read
            return read.op

        def complete(j: int, res: int) -> None:
            i = todo[j]
            try:
                results[i] = self._finish_read(reads.pop(j), res)
            except BlockError as exc:
                results[i] = exc
            except Exception as exc:
                errors.append(exc)

        if todo:
            self.io.run(len(todo), prepare, complete)
        if errors:
            raise errors[0]
        return results

    def put(self, key: bytes, payload, meta: BlockMeta = RAW_META) -> bool:
        return self.put_many([(key, payload, meta)])[0]

    def put_many(self, items: Sequence[tuple[bytes, object, BlockMeta]]) -> list[bool]:
        results = [False] * len(items)
        if not items:
            return results
        writes: dict[int, _Write] = {}
        errors: list[Exception] = []
        evicted: list[bytes] = []
        todo: list[int] = list(range(len(items)))

        def prepare(j: int) -> IOOp | None:
            i = todo[j]
            try:
                write = self._plan_write(*items[i], evicted)
            except Exception as exc:
                errors.append(exc)
                return None
            if write is None:
                return None
            writes[j] = write
            return write.op

        def complete(j: int, res: int) -> None:
            try:
                results[todo[j]] = self._publish(writes.pop(j), res)
            except Exception as exc:
                errors.append(exc)

        try:
            if isinstance(self.io, UringIO):
                todo = self._ring_writes(items, results, evicted)
            if todo:
                self.io.run(len(todo), prepare, complete)
        finally:
            self._notify_evicted_many(evicted)
        if errors:
            raise errors[0]
        return results

    def delete(self, key: bytes) -> bool:
        with self._lock:
            entry = self._index.pop(key, None)
            if entry is None:
                return False
            if not entry.file.own:
                return True  # another writer's block: forgotten here (found again on rescan)
            self._policy.remove(key)
        # the slot is nobody's until freed below: no write can land in it meanwhile; if this
        # fails, the block may come back on reopen (its checks still hold)
        with contextlib.suppress(OSError):
            os.pwritev(entry.file.fd, [self._zero], entry.offset)
        with self._lock:  # counted as held until now: used + free never exceeds the capacity
            heapq.heappush(entry.file.free, entry.slot)
            self._used -= entry.file.slot_size
            self._free_bytes += entry.file.slot_size
        return True

    def usage(self) -> TierUsage:
        with self._lock:
            return TierUsage(self._used, self.capacity, len(self._index), tuple(self.notes))

    def iter_keys(self) -> Iterator[bytes]:
        with self._lock:
            keys = list(self._index)
        return iter(keys)

    @property
    def file_bytes(self) -> int:
        """Bytes of this writer's slab files (slots of every state, growth chunks included)."""
        with self._lock:
            return sum(f.slots * f.slot_size for fs in self._classes.values() for f in fs)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.io.close()
        with self._lock:
            for files in self._classes.values():
                for f in files:
                    with contextlib.suppress(OSError):
                        Path(f.path + CLEAN).touch()
                    os.close(f.fd)  # releases the lock
            for f in self._foreign.values():
                os.close(f.fd)
            self._classes.clear()
            self._foreign.clear()
            self._index.clear()
        self._pool.clear()

    # --- internals: reads --------------------------------------------------------------------
    def _plan_read(self, key: bytes, out, rescan: bool = True) -> _Read | None:
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
        return _Read(key, entry, target, scratch, fast, IOOp(entry.file.fd, bufs, entry.offset))

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
                        n = codec.decode_into(memoryview(body), read.target, header.meta.dtype)
                        if n != header.raw_len:
                            raise CorruptBlockError(
                                f"block decoded to {n} bytes, header says {header.raw_len}"
                            )
            with self._lock:
                current = self._index.get(read.key) is entry
                if ok:
                    if current and entry.file.own:
                        self._policy.touch(read.key)
                    return header
                if not current:
                    return None  # the block left (or moved) while it was read: a miss
                if not entry.file.own:
                    del self._index[read.key]  # its writer reused the slot: a miss
                    return None
            raise self._read_error(read, res, expected)
        finally:
            self._pool.give(scratch)

    def _read_error(self, read: _Read, res: int, expected: int) -> BlockError:
        """The precise error of a read of this writer's block that failed its checks."""
        if res < 0:
            return SlabIOError(f"reading block {read.key.hex()}: {os.strerror(-res)}")
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

    def _rescan(self) -> bool:
        """Index blocks other writers added to their files (rate-limited); True if it ran."""
        now = time.monotonic()
        if now - self._last_rescan < self.rescan_s or self._closed:
            return False
        if not self._rescan_lock.acquire(blocking=False):
            return False
        try:
            self._last_rescan = now
            with self._lock:
                own = {f.path for fs in self._classes.values() for f in fs}
            found: list[tuple[int, bytes, _Entry]] = []
            for path, slot_size in _slab_files(self.root):
                if path in own:
                    continue
                f = self._foreign.get(path) or self._open_foreign(path, slot_size)
                if f is None:
                    continue
                try:
                    st = os.fstat(f.fd)
                except OSError:
                    continue
                sig = (st.st_size, st.st_mtime_ns)
                if sig == f.sig and now - f.scanned < self.rescan_full_s:
                    continue
                f.sig, f.scanned, f.slots = sig, now, st.st_size // slot_size
                found += self._scan(f, verify=False)
            found.sort(key=lambda t: t[0])
            with self._lock:
                for seq, key, entry in found:
                    cur = self._index.get(key)
                    if cur is None or (not cur.file.own and cur.seq <= seq):
                        self._index[key] = entry
            return True
        finally:
            self._rescan_lock.release()

    # --- internals: writes -------------------------------------------------------------------
    def _prepare_block(
        self, key: bytes, payload, meta: BlockMeta, evicted: list[bytes]
    ) -> tuple[_Entry, memoryview] | None:
        """Admit, encode and place a block: its index entry-to-be (header, slot) and stored
        bytes; None when not admitted or there is no room."""
        raw = memoryview(payload).cast("B")
        codec = get_codec(meta.codec)
        stored = raw if codec.name == "raw" else memoryview(codec.encode(raw, meta.dtype)).cast("B")
        n = stored.nbytes
        with self._lock:
            if not self._admission.admit(key, key in self._index):
                return None
            place = self._take_slot(max(self.min_slot, PAGE + align_up(n)), evicted)
            if place is None:
                return None
            self._seq = seq = max(self._seq + 1, time.time_ns())
        zeroed = _header_bytes(self.namespace, key, meta, codec.id, raw.nbytes, n, 0)
        head, checksum, seed = _short.seal(zeroed[:SEQ_AT] + seq.to_bytes(8, "little"), stored)
        header = BlockHeader(self.namespace, key, meta, raw.nbytes, n, checksum)
        return _Entry(place[0], place[1], head, header, seed, seq), stored

    def _plan_write(
        self, key: bytes, payload, meta: BlockMeta, evicted: list[bytes]
    ) -> _Write | None:
        planned = self._prepare_block(key, payload, meta, evicted)
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
        return _Write(key, entry, scratch, op, meta.value)

    def _take_slot(self, size: int, evicted: list[bytes]) -> tuple[_File, int] | None:
        """A slot of ``size`` bytes for a write, evicting as needed; None when there is no room."""
        if size > self.capacity:
            return None
        with self._lock:
            pinned = self.is_pinned if self._pinned is not None else None
            while True:
                files = self._classes.get(size, ())
                for f in files:
                    if f.free:
                        self._free_bytes -= size
                        self._used += size
                        return f, heapq.heappop(f.free)
                if self._used + self._free_bytes + size <= self.capacity:
                    place = self._fresh_slot(size)
                    if place is None:
                        return None
                    self._used += size
                    return place
                if self._free_bytes:  # free slots of other sizes give their room back first
                    self._punch_locked()
                    continue
                victim = self._policy.victim(pinned)
                if victim is None:
                    return None
                self._evict_locked(victim, evicted)

    def _fresh_slot(self, size: int) -> tuple[_File, int] | None:
        """A never-used (or punched) slot of ``size`` bytes; grows or creates a file."""
        files = self._classes.get(size)
        if files is None:
            path = str(self.root / f"{self.writer}-{size}{SUFFIX}")
            fd = os.open(path, self._rw_flags() | os.O_CREAT | os.O_EXCL, 0o644)
            _try_lock(fd)
            files = self._classes[size] = [_File(path, size, fd, own=True)]
        for f in files:
            if f.hollow:
                return f, heapq.heappop(f.hollow)
        f = files[0]
        grow = max(1, min(GROW_BYTES, self.capacity) // size)
        try:
            os.posix_fallocate(f.fd, f.slots * size, grow * size)
        except OSError as exc:
            if exc.errno in _NOSPACE:
                grow = 1  # no room to preallocate: the write itself may still fit
        first = f.slots
        f.slots += grow
        f.hollow.extend(range(first + 1, first + grow))  # sorted: still a heap
        return f, first

    def _punch_locked(self) -> None:
        """Give the bytes of one free slot back to the filesystem (it becomes hollow)."""
        for files in self._classes.values():
            for f in files:
                if f.free:
                    slot = heapq.heappop(f.free)
                    size = f.slot_size
                    self._free_bytes -= size
                    heapq.heappush(f.hollow, slot)
                    ret = _libc.fallocate(
                        f.fd, _PUNCH, ctypes.c_long(slot * size), ctypes.c_long(size)
                    )
                    if ret != 0:
                        self._note(
                            "this filesystem cannot punch holes: slab files keep the room of "
                            "freed slots of other sizes (not counted against the capacity)"
                        )
                    return

    def _publish(self, write: _Write, res: int) -> bool:
        """Index a written block (``res``: bytes written or ``-errno``); a failed write gives
        its slot back."""
        self._pool.give(write.scratch)
        expected = sum(memoryview(b).nbytes for b in write.op.bufs)
        return self._commit(write.key, write.entry, res, expected, write.value)

    def _commit(self, key: bytes, entry: _Entry, res: int, expected: int, value: float) -> bool:
        f, size = entry.file, entry.file.slot_size
        with self._lock:
            if res != expected:
                self._used -= size
                heapq.heappush(f.free, entry.slot)
                self._free_bytes += size
                if res >= 0 or -res in _NOSPACE or -res == errno.ECANCELED:
                    return False
                raise OSError(-res, f"writing block {key.hex()}: {os.strerror(-res)}")
            old = self._index.get(key)
            if old is not None:
                self._drop_locked(key, old)
            self._index[key] = entry
            self._policy.insert(key, size, value)
        return True

    # --- internals: the io_uring short path --------------------------------------------------
    def _ring_writes(
        self, items: Sequence[tuple[bytes, object, BlockMeta]], results: list, evicted: list
    ) -> list[int]:
        """Write raw blocks as ``[header page][payload pages from the caller][tail page]`` from
        scratch slots kept with the ring; returns the indices left to the general path."""
        io = self.io
        assert isinstance(io, UringIO)
        todo = [i for i, item in enumerate(items) if item[2].codec == "raw"]
        rest = [i for i, item in enumerate(items) if item[2].codec != "raw"]
        if not todo:
            return rest
        inflight: dict[int, tuple[int, _Entry, float, int]] = {}
        errors: list[Exception] = []
        direct = self.direct
        ring = io.take_ring()
        slots = _Slots.of(ring, io.depth, self.staging)
        scratch = slots.scratch

        def start(j: int) -> bool:
            i = todo[j]
            key, payload, meta = items[i]
            try:
                stored = memoryview(payload).cast("B")
                addr = buffer_address(stored, 0, writable=False) if direct else address(stored)
                if not addr:
                    rest.append(i)  # an unaligned payload: the general path copies it
                    return False
                planned = self._prepare_block(key, stored, meta, evicted)
            except Exception as exc:
                errors.append(exc)
                return False
            if planned is None:
                return False
            entry, stored = planned
            slot = slots.free.pop()
            at = slot * _SLOT
            if slot in slots.read_into:  # a read left a header page here: zero its padding
                slots.read_into.discard(slot)
                scratch[at + HEADER_SIZE : at + PAGE] = 0
            scratch[at : at + HEADER_SIZE] = np.frombuffer(entry.head, np.uint8)
            n = stored.nbytes
            bulk = n // PAGE * PAGE
            if n > bulk:
                tail = scratch[at + PAGE : at + _SLOT]
                tail[: n - bulk] = np.frombuffer(stored, np.uint8, n - bulk, bulk)
                tail[n - bulk :] = 0
            inflight[j] = (slot, entry, meta.value, PAGE + align_up(n))
            addr = slots.stage_write(slot, stored, bulk, addr)  # huge pages: few segments
            slots.prepare_at(
                j, slot, _uring.OP_WRITEV, entry.file.fd, addr, bulk, n > bulk, entry.offset
            )
            return True

        def finish(j: int, res: int) -> None:
            slot, entry, value, expected = inflight.pop(j)
            slots.release(slot)
            i = todo[j]
            try:
                results[i] = self._commit(items[i][0], entry, res, expected, value)
            except Exception as exc:
                errors.append(exc)

        try:
            slots.drive(len(todo), start, finish)
        finally:
            io.give_ring(ring)
        if errors:
            raise errors[0]
        rest.sort()
        return rest

    def _ring_reads(self, keys: Sequence[bytes], outs: Sequence, results: list) -> list[int]:
        """Read indexed raw blocks into page-aligned caller buffers (header and tail pages
        into ring scratch), checking header bytes and checksum; returns the indices left to
        the general path (other buffers, other codecs, failed checks of this writer's blocks:
        the general path reads them again and raises the precise error)."""
        io = self.io
        assert isinstance(io, UringIO)
        todo: list[tuple[int, _Entry, int]] = []
        rest: list[int] = []
        index = self._index
        for i, key in enumerate(keys):
            entry = index.get(key)
            if entry is None:
                continue  # a miss
            stored = entry.header.stored_len
            addr = buffer_address(outs[i], stored, writable=True)
            if addr and entry.header.meta.codec == "raw":
                todo.append((i, entry, addr))
            else:
                rest.append(i)
        if not todo:
            return rest
        inflight: dict[int, int] = {}
        served: list[bytes] = []
        ring = io.take_ring()
        slots = _Slots.of(ring, io.depth, self.staging)
        scratch = slots.scratch

        def start(j: int) -> bool:
            _, entry, addr = todo[j]
            stored = entry.header.stored_len
            bulk = stored // PAGE * PAGE
            slot = slots.free.pop()
            inflight[j] = slot
            slots.read_into.add(slot)
            addr = slots.stage_read(slot, bulk, addr)  # huge pages: few device segments
            slots.prepare_at(
                j, slot, _uring.OP_READV, entry.file.fd, addr, bulk, stored > bulk, entry.offset
            )
            return True

        def finish(j: int, res: int) -> None:
            slot = inflight.pop(j)
            i, entry, _ = todo[j]
            try:
                header = entry.header
                stored = header.stored_len
                bulk = stored // PAGE * PAGE
                at = slot * _SLOT
                ok = res == PAGE + align_up(stored)
                if ok and scratch[at : at + HEADER_SIZE].tobytes() == entry.head:
                    out = outs[i]
                    dst = out if type(out) is np.ndarray else np.frombuffer(out, np.uint8)
                    if dst.ndim != 1:
                        dst = dst.reshape(-1)
                    staged = slots.staging.lent(slot)
                    h = entry.seed.copy()
                    if bulk:
                        h.update(dst[:bulk] if staged is None else staged)
                    tail = scratch[at + PAGE : at + PAGE + stored - bulk]
                    h.update(tail)
                    if h.intdigest() == header.checksum:
                        if staged is not None:  # only a checked block reaches the caller
                            dst[:bulk] = staged
                        if stored > bulk:
                            dst[bulk:stored] = tail
                        results[i] = header
                        served.append(keys[i])
                        return
                with self._lock:
                    current = self._index.get(keys[i]) is entry
                    if current and not entry.file.own:
                        del self._index[keys[i]]  # its writer reused the slot: a miss
                    elif current:
                        rest.append(i)
            finally:
                slots.release(slot)

        try:
            slots.drive(len(todo), start, finish)
        finally:
            io.give_ring(ring)
        if served:
            with self._lock:
                for key in served:
                    entry = self._index.get(key)
                    if entry is not None and entry.file.own:
                        self._policy.touch(key)
        rest.sort()
        return rest

    # --- internals: leaving blocks -----------------------------------------------------------
    def _drop_locked(self, key: bytes, entry: _Entry) -> None:
        """Remove ``key``'s entry; an own slot becomes free (its bytes still counted)."""
        if self._index.get(key) is entry:
            del self._index[key]
        if entry.file.own:
            self._policy.remove(key)
            size = entry.file.slot_size
            self._used -= size
            heapq.heappush(entry.file.free, entry.slot)
            self._free_bytes += size

    def _evict_locked(self, key: bytes, evicted: list[bytes]) -> None:
        entry = self._index.get(key)
        if entry is None:
            self._policy.remove(key)
            return
        if self.spilling:
            self._spill_locked(key, entry)
        self._policy.remove(key)  # first: the policy sees the eviction of the key it named
        self._drop_locked(key, entry)
        evicted.append(key)

    def _spill_locked(self, key: bytes, entry: _Entry) -> None:
        """Hand the victim's payload to spill listeners (a bad block is dropped silently)."""
        out = np.empty(entry.header.raw_len, np.uint8)
        try:
            read = self._plan_read(key, out, rescan=False)
            if read is None or self._finish_read(read, run_inline(read.op)) is None:
                return
        except (OSError, BlockError, BufferTooSmallError):
            return
        self._notify_spilling(key, out, entry.header.meta)


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


__all__ = ["SlabIOError", "SlabTier"]
