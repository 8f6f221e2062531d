"""Local NVMe tier, one file per block (``file://``): O_DIRECT, parallel I/O, crash-safe.

Layout: ``<dir>/<namespace hex>/<first key byte hex>/<key hex>.kvb``, each file a header page and
the payload in whole pages (see ``blockfile``). Files of blocks that left are kept in
``<dir>/<namespace hex>/free/`` and overwritten by later writes of the same size (``freefiles``);
blocks, writes in flight and kept files together never exceed the capacity (the ledger's
``used`` and ``kept``).

A write fills a kept file where it lies in ``free/`` or a new ``<key hex>.<pid>.<random>.tmp``
(with O_DSYNC when ``sync``), then ``rename`` puts the file in place: a block is visible only once
fully written, and a torn write leaves only a kept or temp file. On open the index is rebuilt by
scanning the directory (oldest file first in eviction order); temp files of dead writers and
files that are not whole pages are removed; headers and checksums are checked on every read.
``dirsync=1`` fsyncs the folders of a batch's renamed files once each after the batch, so the
renames survive a crash (without it a crash may lose the newest blocks, never serve a torn one).

Blocks written by another process into the same directory are served on a read and then
indexed here; ``contains_many`` looks on disk from the first key the index lacks up to the
first key with no file (one ``stat`` per prefix lookup). Several processes may read and write
the same keys: rename is atomic and files still open are never reused (a file lease proves it),
so a reader sees the old or the new block, never a mix.

Batches on io_uring take the ring batch path (``io.batch``): raw writes, and reads of raw blocks
whose header the tier holds, move ``[header page][payload][tail page]`` with little Python per
block; anything unusual is redone by the general path, which raises the precise error. A write
here pays per-block file work (open, a lease check, a rename) that ``slab://`` does not.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.codec import (
    HEADER_SIZE,
    BlockError,
    BlockHeader,
    BlockMeta,
    CorruptBlockError,
    RawCodec,
    pack_block,
    parse_header,
)
from kvtier.codec.container import (
    CHECKSUM_OFFSET,
    Encoded,
    check_digest_header,
    digest_header,
)
from kvtier.codec.digest import payload_digest, tensor_digest, tensor_digests
from kvtier.codec.errors import BufferTooSmallError
from kvtier.errors import ConfigError
from kvtier.tiers.files.base import NOSPACE, BlockIOError, FileTier
from kvtier.tiers.files.blockfile import (
    KnownHeader,
    ReadPlan,
    WritePlan,
    file_size,
    finish_read,
    plan_read,
    plan_write,
)
from kvtier.tiers.files.device_io import DeviceFileIO, KvikioFileIO
from kvtier.tiers.files.freefiles import FreeFiles, sole_opener, unlink
from kvtier.tiers.files.options import PerBlockOptions
from kvtier.tiers.io import batch as _short
from kvtier.tiers.io.backends import IOOp, UringIO, run_inline
from kvtier.tiers.io.batch import Known, RawHeaders, WriteOp, seed_of
from kvtier.tiers.io.buffers import PAGE

SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"
FREE_DIR = "free"
STALE_TMP_SECONDS = 3600.0
#: Files removed, at most, to find an inode for a new block file or folder when none is left.
INODE_TRIES = 8
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass(slots=True)
class _Entry:
    size: int  # bytes of the file
    raw: bool | None = None  # payload stored as is (codec raw); None until read
    known: KnownHeader | None = None  # the header last read from the file, bytes and parsed
    fast: Known | None = None  # a raw block's header as stored: reads take the ring batch path


@dataclass(slots=True)
class _Read:
    key: bytes
    fd: int
    plan: ReadPlan
    out: object
    entry: _Entry | None  # the index entry the file size came from (None: from fstat)


@dataclass(slots=True)
class _Write:
    key: bytes
    fd: int
    tmp: str
    raw: bool
    plan: WritePlan
    value: float = 0.0
    fast: Known | None = None


class DiskTier(FileTier):
    """Blocks as files on a local filesystem, one file per block, bounded by ``capacity``
    bytes of files (kept files included)."""

    scheme = "file"
    options = PerBlockOptions
    layout = "per-block"
    ring_batch_min = 2

    def __init__(
        self,
        namespace: bytes,
        directory: str | os.PathLike,
        capacity: int,
        *,
        recycle: bool = True,
        dirsync: bool = False,
        gds: bool = False,
        device_io: DeviceFileIO | None = None,
        **common: Any,
    ):
        """``common``: the options of every file tier (see :class:`FileTier`). ``gds``: the
        device verbs move GPU memory through kvikio; ``device_io``: what moves their bytes
        instead (e.g. :class:`~kvtier.tiers.files.device_io.PosixFileIO` for CPU tensors)."""
        if gds and device_io is None:
            device_io = KvikioFileIO()  # refuses in one line where GDS cannot work
        if device_io is not None:
            common["codec"] = "raw"  # a GPU reads payloads as they are: nothing to decode
        super().__init__(namespace, directory, capacity, **common)
        self.device_io = device_io
        self.dirsync = dirsync
        self.recycle = recycle
        self._dirs: set[str] = set()
        self._headers = RawHeaders(namespace)
        self._free = FreeFiles(str(self.root / FREE_DIR))
        self._scan()
        self._notify_evictions()

    # --- setup -------------------------------------------------------------------------------
    def _scan(self) -> None:
        """Rebuild the index from the directory, evicting to fit the capacity."""
        found: list[tuple[int, bytes, int]] = []
        now = time.time()
        for sub in _scandir(self.root):
            if not (sub.is_dir() and len(sub.name) == 2):
                continue
            for f in _scandir(sub.path):
                name = f.name
                if name.endswith(TMP_SUFFIX):
                    if _stale_tmp(f, now):
                        unlink(f.path)
                    continue
                if not name.endswith(SUFFIX) or len(name) != 32 + len(SUFFIX):
                    continue
                try:
                    key = bytes.fromhex(name[:32])
                    st = f.stat()
                except (ValueError, OSError):
                    continue
                if st.st_size < PAGE or st.st_size % PAGE:
                    unlink(f.path)  # never a block this tier wrote completely
                    continue
                found.append((st.st_mtime_ns, key, st.st_size))
        found.sort()
        with self._lock:
            self._free.scan()
            if not self.recycle:
                self._free.clear()
            self.ledger.keep(self._free.bytes)
            for _, key, size in found:
                self.ledger.adopt(key, _Entry(size), size)
            self.ledger.shrink(self._drop, reclaim=self._reclaim_locked)

    # --- verbs -------------------------------------------------------------------------------
    def block_path(self, key: bytes) -> str:
        """The file that holds (or would hold) the block of ``key``."""
        h = key.hex()
        return f"{self.root}/{h[:2]}/{h}{SUFFIX}"

    def contains(self, key: bytes) -> bool:
        return key in self._index or self._adopt(key)

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Index membership; from the first key the index lacks, also files on disk (blocks
        other processes wrote since this one scanned), up to the first key with no file: a
        prefix lookup stops there, so this costs one ``stat`` per call, not one per key."""
        index = self._index
        found = [k in index for k in keys]
        if False in found:
            i, n = found.index(False), len(keys)
            while i < n:
                if not found[i]:
                    if not self._adopt(keys[i]):
                        break
                    found[i] = True
                i += 1
        return found

    def get_many_into(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        results: list[BlockHeader | BlockError | None] = self._results(keys, outs)
        todo = self._short_reads(keys, outs, results) if len(keys) > 1 else range(len(keys))
        self._read_batch(keys, outs, todo, results)
        return results

    def put_many(self, items: Sequence[tuple[bytes, object, BlockMeta]]) -> list[bool]:
        items = self._coded_items(items)
        results = [False] * len(items)
        try:
            todo: Sequence[int] = range(len(items))
            if len(items) > 1 and self.device_io is None:  # the ring's headers have no digest
                todo = self._ring_writes(items, results)
            self._write_batch(
                items, todo, self._open_write, self._finish_write, results, inline=True
            )
        finally:
            self._notify_evictions()
        if self.dirsync:
            self._sync_dirs(key for (key, _, _), ok in zip(items, results, strict=True) if ok)
        return results

    def _sync_dirs(self, keys) -> None:
        """fsync the folders of renamed block files, once each: the renames survive a crash."""
        for folder in {os.path.dirname(self.block_path(k)) for k in keys}:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        self.io.close()
        self._decoders.close()
        self._pool.clear()
        with self._lock:
            self._free.release()
            self.ledger.reclaimed(self.ledger.kept)

    @property
    def recycled_bytes(self) -> int:
        """Bytes of files kept for reuse (counted against the capacity, not in ``used``)."""
        return self.ledger.kept

    # --- internals: reads --------------------------------------------------------------------
    def _short_reads(self, keys: Sequence[bytes], outs: Sequence, results: list) -> list[int]:
        """Serve what the ring batch path can (see ``io.batch``); the indices left over."""
        everything = list(range(len(keys)))
        if not isinstance(self.io, UringIO):
            return everything
        index = self._index
        short: list[int] = []
        knowns: list[Known] = []
        for i, key in enumerate(keys):
            entry = index.get(key)
            fast = entry.fast if entry is not None else None
            if fast is not None:
                short.append(i)
                knowns.append(fast)
        if len(short) < 2:
            return everything
        path, oflags = self.block_path, self._oflags | os.O_RDONLY
        gone: list[int] = []

        def locate(j: int) -> tuple[int, int] | None:
            try:
                return os.open(path(keys[short[j]]), oflags | _O_CLOEXEC), 0
            except FileNotFoundError:
                gone.append(j)  # a miss
                return None

        served: list[int] = []
        sub: list = [None] * len(short)
        with self._ring_slots() as slots:
            redo = _short.read_known(
                slots, locate, knowns, [outs[i] for i in short], sub, served, close=True
            )
        for j in gone:
            self._forget(keys[short[j]])
        with self._lock:
            touch = self.ledger.touch
            for j in served:
                i = short[j]
                results[i] = sub[j]
                touch(keys[i])
        taken = set(short).difference(short[j] for j in redo)
        return [i for i in everything if i not in taken]

    def _plan_read(self, key: bytes, out) -> tuple[_Read, IOOp] | None:
        try:
            fd = os.open(self.block_path(key), os.O_RDONLY | self._oflags | _O_CLOEXEC)
        except FileNotFoundError:
            self._forget(key)
            return None
        try:
            entry = self._index.get(key)
            maybe_raw = entry is None or entry.raw is not False
            size = entry.size if entry is not None else os.fstat(fd).st_size  # one syscall less
            plan = plan_read(size, out, self._pool, direct=self.direct, maybe_raw=maybe_raw)
            return _Read(key, fd, plan, out, entry), IOOp(fd, plan.bufs)
        except BaseException:
            os.close(fd)
            raise

    def _finish_read(self, read: _Read, res: int, touch: bool = True) -> BlockHeader:
        try:
            if res < 0:
                self._pool.give(read.plan.scratch)
                raise BlockIOError(f"reading block {read.key.hex()} failed: {os.strerror(-res)}")
            entry = read.entry
            known = entry.known if entry is not None else None
            try:
                header, known = finish_read(
                    read.plan, res, self.namespace, read.key, self._pool, known
                )
            except CorruptBlockError:
                size = os.fstat(read.fd).st_size
                if entry is None or size == read.plan.size:
                    raise
                # another writer replaced the file with one of another size: read what is there
                plan = plan_read(size, read.out, self._pool, direct=self.direct, maybe_raw=True)
                res = run_inline(IOOp(read.fd, plan.bufs))
                header, known = finish_read(plan, res, self.namespace, read.key, self._pool)
        finally:
            os.close(read.fd)
        if touch:
            if read.entry is None and read.key not in self._index:
                self._adopt(read.key, file_size(header.stored_len))  # another process wrote it
            with self._lock:
                entry = self._index.get(read.key)
                if entry is not None:
                    entry.raw = header.meta.codec == "raw"
                    if entry.known is not known:
                        entry.known = known
                        fast = entry.raw and header.digest is None  # the ring checks xxh3 only
                        entry.fast = _known(known[0], header) if fast else None
                    self.ledger.touch(read.key)
        return header

    def _read_victim(self, key: bytes, entry: _Entry) -> tuple[np.ndarray, BlockHeader] | None:
        with open(self.block_path(key), "rb") as f:
            header = parse_header(f.read(HEADER_SIZE), self.namespace, key)
        out = np.empty(header.raw_len, np.uint8)
        planned = self._plan_read(key, out)
        if planned is None:
            return None
        read, op = planned
        return out, self._finish_read(read, run_inline(op), False)

    def _adopt(self, key: bytes, size: int | None = None) -> bool:
        """Index a block file another process wrote (``size``: its bytes, else from ``stat``);
        False when there is none. Evicts to stay within the capacity, like a write."""
        if size is None:
            try:
                size = os.stat(self.block_path(key)).st_size
            except OSError:
                return False
            if size < PAGE or size % PAGE:
                return False  # not a block this tier could have written completely
        with self._lock:
            if key not in self._index:
                if size > self.ledger.limit:
                    return True  # served when read, never indexed
                self.ledger.adopt(key, _Entry(size), size)
                # never the block just asked for (a cost policy ranks it last: no value)
                self.ledger.shrink(
                    self._drop,
                    reclaim=self._reclaim_locked,
                    spill=self._spill if self.spilling else None,
                    pinned=lambda k: k == key or self.is_pinned(k),
                )
            held = key in self._index
        self._notify_evictions()
        return held

    def _forget(self, key: bytes) -> None:
        """The file is gone (another process deleted it): drop it from the index."""
        with self._lock:
            if key in self._index and not os.path.exists(self.block_path(key)):
                _, size = self.ledger.pop(key)  # type: ignore[misc]
                self.ledger.release(size)

    # --- internals: writes -------------------------------------------------------------------
    def _admit(self, key: bytes, size: int) -> bool:
        if self.ledger.admission is None:
            return True
        with self._lock:
            return self.ledger.admit(key, size)

    def _reserve(self, key: bytes, size: int) -> tuple[int, str] | None:
        """Room for a write of ``size`` bytes and the file it fills: (fd, its path) or None
        when there is no room (the filesystem's included)."""
        final = self.block_path(key)
        folder = final[: final.rindex("/")]
        if folder not in self._dirs:
            if not self._make_folder(folder):
                return None
            self._dirs.add(folder)
        for _ in range(INODE_TRIES):
            with self._lock:
                ok, reuse = self._make_room_locked(size)
            if not ok:
                return None
            try:
                return self._create_tmp(final, reuse)
            except BaseException as exc:
                self._unreserve(size)
                if isinstance(exc, FileNotFoundError):  # its folder went for an inode meanwhile
                    self._dirs.discard(folder)
                    if not self._make_folder(folder):
                        return None
                    self._dirs.add(folder)
                    continue
                if not isinstance(exc, OSError) or exc.errno not in NOSPACE:
                    raise
            # no inode for the file: lower the limit, free one, and try again
            self._out_of_space()
            with self._lock:
                if not self._free_inode_locked():
                    return None
        return None

    def _make_folder(self, folder: str) -> bool:
        """Create a block folder; with no inode left for it, free one (a kept file's, else the
        next victim's) and try again, as a write evicts for room. False when none frees."""
        for _ in range(INODE_TRIES):
            try:
                os.makedirs(folder, exist_ok=True)
                return True
            except OSError as exc:
                if exc.errno not in NOSPACE:
                    raise
            self._out_of_space()
            with self._lock:
                if not self._free_inode_locked():
                    return False
        return False

    def _free_inode_locked(self) -> bool:
        """Remove one file: a kept one, else the policy's next victim's (not kept for reuse)."""
        return self.ledger.free_one(
            self._remove,
            reclaim=self._reclaim_locked,
            spill=self._spill if self.spilling else None,
            pinned=self.is_pinned if self._pinned is not None else None,
        )

    def _remove(self, key: bytes, entry: _Entry, size: int) -> None:
        """A block left the books and its file goes, with its folder if that is now empty (an
        inode is wanted back: a folder per block is what a filesystem short of them holds)."""
        self.ledger.release(size)
        path = self.block_path(key)
        unlink(path)
        folder = path[: path.rindex("/")]
        try:
            os.rmdir(folder)
        except OSError:
            return  # not empty (or already gone)
        self._dirs.discard(folder)

    def _reuse_locked(self, size: int) -> str | None:
        return self._free.take(size) if self.recycle else None

    def _reclaim_locked(self) -> int:
        return self._free.drop_one()

    def _unreserve(self, size: int) -> None:
        with self._lock:
            self.ledger.release(size)

    def _open_write(
        self,
        key: bytes,
        payload,
        meta: BlockMeta,
        encoded: Encoded | None = None,
    ) -> tuple[_Write, IOOp] | None:
        if not self._admit(key, memoryview(payload).nbytes):
            return None
        if self.device_io is not None and encoded is None and meta.codec == RawCodec.name:
            stored = memoryview(payload).cast("B")  # a block the device verbs can read
            digest = payload_digest(stored)
            header = digest_header(self.namespace, key, meta, stored.nbytes, digest)
        else:
            header, stored = pack_block(self.namespace, key, payload, meta, encoded)
        plan = plan_write(header, stored, self._pool, direct=self.direct)
        opened = self._reserve(key, plan.size)
        if opened is None:
            self._pool.give(plan.scratch)
            return None
        fd, tmp = opened
        raw = meta.codec == "raw"
        ring = raw and self.device_io is None  # the ring checks a block's xxh3 only
        fast = _written(self.namespace, key, header, meta, stored.nbytes) if ring else None
        write = _Write(key, fd, tmp, raw, plan, meta.value, fast)
        return write, IOOp(fd, plan.bufs, write=True)

    def _create_tmp(self, final: str, reuse: str | None) -> tuple[int, str]:
        """Open the file a write fills before it is renamed into place as ``final``: a kept
        file, written where it lies (a torn write there leaves just a kept file), or a new temp
        file next to ``final``."""
        flags = self._rw_flags(write_only=True)
        stem = f"{final[: -len(SUFFIX)]}.{os.getpid()}."
        if reuse is not None:
            try:
                fd = os.open(reuse, flags)
            except FileNotFoundError:  # taken by another process sharing the directory
                pass
            else:
                # no other opener (a reader of the old block, another process's writer) now; the
                # fd stays open until the file is renamed into place, which keeps it that way
                alone = sole_opener(fd)
                if alone:
                    return fd, reuse
                os.close(fd)  # someone still holds it: leave the file to them
                unlink(reuse)
                if alone is None:
                    self.recycle = False
                    self._note("file leases are unavailable here: block files are not reused")
        for _ in range(3):
            tmp = f"{stem}{secrets.token_hex(6)}{TMP_SUFFIX}"
            try:
                return os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o644), tmp
            except FileExistsError:
                continue
        raise FileExistsError(f"cannot create a temp file next to {final}")

    def _finish_write(self, write: _Write, res: int) -> bool:
        self._pool.give(write.plan.scratch)
        return self._publish(write, write.plan.size, res)

    def _publish(self, write: _Write, size: int, res: int) -> bool:
        """Rename a written file of ``size`` bytes into place and index it (``res``: bytes
        written or ``-errno``); a failed write gives its room back."""
        try:
            if res != size:
                unlink(write.tmp)
                self._unreserve(size)
                return self._write_failed(write.key, res)
            with self._lock:
                try:
                    os.replace(write.tmp, self.block_path(write.key))
                except OSError:
                    unlink(write.tmp)
                    self.ledger.release(size)
                    raise
                entry = _Entry(size, write.raw, fast=write.fast)
                old = self.ledger.add(write.key, entry, size, write.value)
                if old is not None:
                    self.ledger.release(old[1])  # its file was replaced by the rename
            return True
        finally:
            os.close(write.fd)  # only now: an open fd keeps a reused file from other takers

    def _ring_write_op(
        self, key: bytes, stored: memoryview, meta: BlockMeta, addr: int
    ) -> tuple[WriteOp, tuple[_Write, int]] | None:
        if not self._admit(key, stored.nbytes):
            return None
        if type(meta.shape) is tuple and type(meta.value) is float:
            head, fast = self._headers.pack(key, stored, meta)
        else:
            head, stored = pack_block(self.namespace, key, stored, meta)
            fast = _written(self.namespace, key, head, meta, stored.nbytes)
        size = PAGE + -(-stored.nbytes // PAGE) * PAGE
        opened = self._reserve(key, size)
        if opened is None:
            return None
        fd, tmp = opened
        write = _Write(key, fd, tmp, True, None, meta.value, fast)  # type: ignore[arg-type]
        return WriteOp(fd, head, stored, addr), (write, size)

    def _ring_written(self, key: bytes, state: tuple[_Write, int], res: int) -> bool:
        return self._publish(*state, res)

    # --- device verbs: payloads straight between files and tensors (gds=1) ------------------
    def read_device(
        self, keys: Sequence[bytes], outs: Sequence[Any]
    ) -> list[BlockHeader | BlockError | None]:
        """Read blocks straight into tensors (GPU memory with ``gds=1``), each verified where
        it landed: the header's xxh3 on the host, the payload's digest on the tensor's device.
        None: a miss, or a block only the host path serves (coded, or stored without a digest
        by ``put_many``): read those with :meth:`get_many_into`."""
        io = self._device_io()
        results: list[BlockHeader | BlockError | None] = []
        landed: list[tuple[int, Any]] = []  # (index, the payload's bytes where they landed)
        for key, out in zip(keys, outs, strict=True):
            try:
                got = self._read_device(io, key, out)
            except BlockError as exc:
                got = exc
            except (OSError, RuntimeError) as exc:  # kvikio raises RuntimeError
                got = BlockIOError(f"reading block {key.hex()} failed: {exc}")
            if isinstance(got, tuple):
                landed.append((len(results), got[1]))
                got = got[0]
            results.append(got)
        digests = tensor_digests([payload for _, payload in landed])  # one wait for them all
        for (i, _), digest in zip(landed, digests, strict=True):
            header = results[i]
            assert isinstance(header, BlockHeader)
            if digest != header.digest:
                results[i] = CorruptBlockError("block payload digest mismatch")
                continue
            if keys[i] not in self._index:
                self._adopt(keys[i], file_size(header.stored_len))  # another process wrote it
            with self._lock:
                self.ledger.touch(keys[i])
        return results

    def write_device(self, items: Sequence[tuple[bytes, Any, BlockMeta]]) -> list[bool]:
        """Store tensors' bytes straight from their memory (GPU memory with ``gds=1``) as raw
        blocks of digest kind 1, the digest computed on the tensor's device; what was stored.
        A device error raises ``OSError``, as ``put_many``'s do (its room is given back)."""
        io = self._device_io()
        try:
            results = [self._write_device(io, key, src, meta) for key, src, meta in items]
        finally:
            self._notify_evictions()
        if self.dirsync:
            self._sync_dirs(key for (key, _, _), ok in zip(items, results, strict=True) if ok)
        return results

    def _device_io(self) -> DeviceFileIO:
        if self.device_io is None:
            raise ConfigError(f"{self.name}: device reads and writes need gds=1")
        return self.device_io

    def _read_device(
        self, io: DeviceFileIO, key: bytes, out: Any
    ) -> tuple[BlockHeader, Any] | None:
        """Read one block's payload into ``out`` after checking its header: the header and the
        payload's bytes there (its digest is checked by the caller); None: a miss, or a block
        only the host path serves."""
        path = self.block_path(key)
        try:
            with open(path, "rb", buffering=0) as f:
                head = f.read(HEADER_SIZE)
        except FileNotFoundError:
            self._forget(key)
            return None
        header = parse_header(head, self.namespace, key)
        if header.digest is None or header.meta.codec != "raw":
            return None
        out = _as_tensor(out)
        room = out.numel() * out.element_size()
        if room < header.stored_len:
            raise BufferTooSmallError(
                f"buffer of {room} bytes cannot hold a {header.stored_len}-byte block"
            )
        check_digest_header(memoryview(head), header)
        got = io.read(path, out, header.stored_len, PAGE)
        if got != header.stored_len:
            raise CorruptBlockError(f"block truncated: {got} of {header.stored_len} payload bytes")
        return header, out.reshape(-1).view(_torch_uint8())[: header.stored_len]

    def _write_device(self, io: DeviceFileIO, key: bytes, src: Any, meta: BlockMeta) -> bool:
        src = src.contiguous()  # the bytes as they would be read back
        nbytes = src.numel() * src.element_size()
        if not self._admit(key, nbytes):
            return False
        meta = meta.with_codec(RawCodec.name)
        head = digest_header(self.namespace, key, meta, nbytes, tensor_digest(src))
        size = file_size(nbytes)
        opened = self._reserve(key, size)
        if opened is None:
            return False
        fd, tmp = opened
        write = _Write(key, fd, tmp, True, None, meta.value)  # type: ignore[arg-type]
        page = self._pool.take(PAGE)
        try:
            page[:HEADER_SIZE] = np.frombuffer(head, np.uint8)
            page[HEADER_SIZE:PAGE] = 0
            res = os.pwrite(fd, memoryview(page)[:PAGE], 0)
            if res == PAGE:
                got = io.write(tmp, src, nbytes, PAGE)
                os.ftruncate(fd, size)
                if self.sync:
                    os.fdatasync(fd)
                res = size if got == nbytes else -errno.EIO
        except OSError as exc:
            res = -(exc.errno or errno.EIO)
        except RuntimeError:  # kvikio's errors: the write failed, its room goes back
            res = -errno.EIO
        finally:
            self._pool.give(page)
        return self._publish(write, size, res)

    # --- internals: leaving blocks -----------------------------------------------------------
    def _drop(self, key: bytes, entry: _Entry, size: int) -> None:
        """A block left the books: its file is kept for reuse, or removed."""
        self.ledger.release(size)
        path = self.block_path(key)
        if self.recycle:
            self.ledger.keep(self._free.add(path))
        else:
            unlink(path)

    def _delete_unbooked_locked(self, key: bytes) -> bool:
        return unlink(self.block_path(key))  # maybe written by another process


# --- helpers -----------------------------------------------------------------------------------
def _known(head: bytes, header: BlockHeader) -> Known:
    return Known(head, header, seed_of(head))


def _written(namespace: bytes, key: bytes, head: bytes, meta: BlockMeta, stored: int) -> Known:
    """What a raw block being written will read back as (its header, without parsing it)."""
    if type(meta.shape) is not tuple or type(meta.value) is not float:
        return _known(head, parse_header(head, namespace, key))
    checksum = int.from_bytes(head[CHECKSUM_OFFSET : CHECKSUM_OFFSET + 8], "little")
    return _known(head, BlockHeader(namespace, key, meta, stored, stored, checksum))


def _torch_uint8() -> Any:
    """torch.uint8, imported where a device verb first needs it (the tier serves without torch)."""
    import torch

    return torch.uint8


def _as_tensor(buf: Any) -> Any:
    """``buf`` as a torch tensor (a host buffer shares its memory)."""
    import torch

    return buf if isinstance(buf, torch.Tensor) else torch.from_numpy(np.asarray(buf))


def _scandir(path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _stale_tmp(entry: os.DirEntry, now: float) -> bool:
    """A temp file whose writer is dead (or that is older than an hour)."""
    parts = entry.name.split(".")
    try:
        pid = int(parts[1])
        if now - entry.stat().st_mtime > STALE_TMP_SECONDS:
            return True
    except (IndexError, ValueError, OSError):
        return True
    return not _alive(pid)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["BlockIOError", "DiskTier"]
