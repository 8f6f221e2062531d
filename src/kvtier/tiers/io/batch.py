"""The file tiers' ring batch path on io_uring: batched reads and writes with little Python per
block, used by ``file://`` and ``slab://``.

The general path (``backends`` + the tiers' plans) builds plan objects and takes pool buffers
and iovec arrays per block; at small blocks that Python, not the device, bounds a tier. Here a
batch takes ``3 × depth`` slots once, each two scratch pages (a header page and a last partial
page) and three iovecs, and every op is a vectored read or write of ``[header page][payload
pages][tail page]`` at the block's file offset, the payload pages in the ring's huge-page
staging (``Staging``: one contiguous range per 2 MiB for the device; copied to or from the
caller's buffer, a read only once checked) while its budget has room, else straight from or
into the caller's buffer. An op goes to the kernel as soon as it is prepared while the ring has
room; ops are prepared up to ``depth`` ahead, and the ring is refilled as soon as a completion
frees room, before the finished ops are checked: the device never waits for that work, nor for
the setup of the next write.

Reads take blocks whose stored header the tier already holds and whose payload is stored raw:
the completion compares the 128 header bytes with the known ones and hashes the payload in
place, from an xxh3 state that already holds the header. Anything unusual is left to the
general path: a block read short, a header that differs (another writer replaced it), a bad
checksum (the general path reads it again and raises the precise error), a buffer that is
unaligned, too small, or not one contiguous byte range.

The block header is built through ``kvtier.codec.container``'s public layout constants.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
import xxhash

from kvtier.codec import BlockHeader, BlockMeta, pack_block
from kvtier.codec.container import CHECKSUM_OFFSET, KEY_OFFSET, VALUE_OFFSET
from kvtier.tiers.io import uring as _uring
from kvtier.tiers.io.buffers import PAGE, address, aligned_array, huge_array

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_U8 = np.dtype(np.uint8)
_IOV = ctypes.sizeof(_uring.Iovec)
SLOT = 2 * PAGE  # a header page and a tail page
_ZERO8 = bytes(8)
_F64 = struct.Struct("<d")
_MAX_TEMPLATES = 64
#: Bytes of huge-page staging per ring (see ``Staging``), unless a tier sets its own.
STAGING_BUDGET = 96 << 20


@dataclass(slots=True)
class Known:
    """What the tier knows of a stored raw block: its header bytes, parsed header, hash seed."""

    head: bytes  # the 128 header bytes as stored
    header: BlockHeader
    seed: xxhash.xxh3_64  # xxh3 state after the header with its checksum field zeroed


def buffer_address(buf, nbytes: int, *, writable: bool) -> int:
    """Address of a page-aligned contiguous byte buffer of at least ``nbytes``, else 0."""
    if type(buf) is np.ndarray:
        flags = buf.flags
        if buf.dtype != _U8 or not flags.c_contiguous or buf.nbytes < nbytes:
            return 0
        if writable and not flags.writeable:
            return 0
    else:
        try:
            view = memoryview(buf)
        except TypeError:
            return 0
        if (writable and view.readonly) or not view.c_contiguous or view.nbytes < nbytes:
            return 0
    try:
        addr = address(buf)
    except (TypeError, ValueError):
        return 0
    return addr if addr % PAGE == 0 else 0


class Staging:
    """Huge-page staging buffers of one ring, within ``budget`` bytes.

    A payload staged here is one physically contiguous range per 2 MiB for the device instead
    of a list of the caller's 4 KiB pages (65 segments for 256 KiB, ~1,440 for 5.6 MiB), which
    on a virtio disk is most of the cost of an op. Buffers are all one size, a whole number of
    MiB that grows to the largest payload asked for (re-cut only while none is lent), and at
    most ``count`` of them (one per scratch slot) fit in the budget; a payload that finds no
    free buffer, or is larger than the budget, goes from/into the caller's buffer instead.
    The memory is mapped on first use.
    """

    UNIT = 1 << 20

    def __init__(self, count: int, budget: int):
        self.count = count
        self.budget = budget
        self.size = 0  # bytes per buffer
        self._array: np.ndarray | None = None
        self._free: list[int] = []
        self._lent: dict[int, tuple[int, np.ndarray]] = {}  # slot -> (buffer number, view)

    def take(self, slot: int, nbytes: int) -> np.ndarray | None:
        """A buffer of ``nbytes`` lent to ``slot`` until :meth:`give`, or None."""
        if nbytes <= 0:
            return None
        if nbytes > self.size and not self._recut(nbytes):
            return None
        if not self._free:
            return None
        b = self._free.pop()
        buf = self._array[b * self.size : b * self.size + nbytes]  # type: ignore[index]
        self._lent[slot] = (b, buf)
        return buf

    def prepare(self, nbytes: int) -> None:
        """Map and fault in buffers for payloads of ``nbytes`` now, not on first use."""
        if nbytes > self.size:
            self._recut(nbytes)

    def lent(self, slot: int) -> np.ndarray | None:
        """The buffer lent to ``slot``, if any."""
        lent = self._lent.get(slot)
        return None if lent is None else lent[1]

    def give(self, slot: int) -> None:
        """Take back ``slot``'s buffer (if it has one)."""
        lent = self._lent.pop(slot, None)
        if lent is not None:
            self._free.append(lent[0])

    def _recut(self, nbytes: int) -> bool:
        size = -(-nbytes // self.UNIT) * self.UNIT
        k = min(self.count, self.budget // size)
        if self._lent or k < 1:
            return False
        if self._array is None or self._array.nbytes < k * size:
            self._array = None
            self._array = huge_array(k * size)
        self.size = size
        self._free = list(range(k - 1, -1, -1))
        return True


class Slots:
    """Scratch slots and their iovecs for one batch on one ring.

    An op is *prepared* (its file opened, its iovecs filled: :meth:`prepare`) up to ``depth``
    ops ahead of the ring, so a slot freed by a completion is refilled at once, and the
    Python that sets up the next op (hashing, opening) runs while the device is busy.
    ``3 × depth`` slots: in the ring, prepared, and finished but not yet checked.
    """

    def __init__(self, ring: _uring.Ring, depth: int, budget: int = STAGING_BUDGET):
        self.ring = ring
        self.depth = depth
        n = 3 * depth
        self.scratch = aligned_array(n * SLOT)  # zeroed
        self.base = self.scratch.ctypes.data
        self.iov = (_uring.Iovec * (3 * n))()
        self.iov_base = ctypes.addressof(self.iov)
        self.free = list(range(n))
        self.read_into: set[int] = set()  # slots whose header page a read filled
        self.ready: deque[tuple[int, int, int, int, int]] = deque()  # prepared ops
        self.staging = Staging(n, budget)

    def stage_read(self, slot: int, bulk: int, addr: int) -> int:
        """Where ``slot``'s read of ``bulk`` payload bytes lands: a staging buffer, else
        ``addr`` (the caller's buffer)."""
        staged = self.staging.take(slot, bulk)
        return addr if staged is None else address(staged)

    def stage_write(self, slot: int, payload, bulk: int, addr: int) -> int:
        """Where ``slot``'s write of ``payload``'s first ``bulk`` bytes comes from: their copy in
        a staging buffer, else ``addr`` (the caller's buffer)."""
        staged = self.staging.take(slot, bulk)
        if staged is None:
            return addr
        staged[:] = np.frombuffer(payload, np.uint8, bulk)
        return address(staged)

    def release(self, slot: int) -> None:
        """Free ``slot`` and its staging buffer."""
        self.staging.give(slot)
        self.free.append(slot)

    @classmethod
    def of(cls, ring: _uring.Ring, depth: int, budget: int = STAGING_BUDGET) -> Self:
        """The slots kept with ``ring`` (made on first use; one batch uses a ring at a time)."""
        slots = getattr(ring, "short_slots", None)
        if type(slots) is not cls or slots.depth != depth or slots.staging.budget != budget:
            slots = cls(ring, depth, budget)
            ring.short_slots = slots
        return slots

    def prepare(
        self,
        i: int,
        slot: int,
        opcode: int,
        fd: int,
        addr: int,
        nbytes: int,
        tail: bool,
        at: int = 0,
    ) -> None:
        """Prepare op ``i``: [header page][``nbytes`` at ``addr``][tail page if ``tail``], at
        file offset ``at``."""
        iov, k = self.iov, 3 * slot
        page = self.base + slot * SLOT
        iov[k].base, iov[k].len = page, PAGE
        count = 1
        if nbytes:
            iov[k + 1].base, iov[k + 1].len = addr, nbytes
            count = 2
        if tail:
            iov[k + count].base, iov[k + count].len = page + PAGE, PAGE
            count += 1
        self.ready.append((opcode, fd, self.iov_base + k * _IOV, count, at, i))

    def _queue_ready(self) -> None:
        ring, ready, depth = self.ring, self.ready, self.depth
        while ready and ring.pending < depth:
            ring.queue(*ready.popleft())

    def drive(self, n: int, start: Callable[[int], bool], finish: Callable[[int, int], None]):
        """``start(i)`` prepares op ``i`` (False: nothing to do); ``finish(i, res)`` checks it.

        Keeps at most ``depth`` ops in flight; on an exception, drains the ring and finishes
        every prepared op (with its result, or ``-ECANCELED``) so nothing is left half done.
        """
        ring, depth, free, ready = self.ring, self.depth, self.free, self.ready
        nxt = 0
        started: set[int] = set()
        try:
            while True:
                while nxt < n and len(ready) < depth and free:
                    if start(nxt):
                        started.add(nxt)
                        if ring.pending < depth:  # to the kernel now, not after the next prep
                            self._queue_ready()
                            ring.submit()
                    nxt += 1
                self._queue_ready()
                if not ring.pending:
                    if nxt >= n and not ready:
                        break
                    continue
                done = ring.wait(1)
                if ready:
                    self._queue_ready()  # refill the ring before checking what finished
                    ring.submit()
                for i, res in done:
                    started.discard(i)
                    finish(i, res)
        finally:
            while ring.pending:
                for i, res in ring.wait(ring.pending):
                    if i in started:
                        started.discard(i)
                        finish(i, res)
            ready.clear()
            for i in sorted(started):
                finish(i, -errno.ECANCELED)


def read_known(
    slots: Slots,
    locate: Callable[[int], tuple[int, int] | None],
    knowns: Sequence[Known],
    outs: Sequence,
    results: list,
    served: list[int],
    *,
    close: bool,
) -> list[int]:
    """Read block ``i``, whose stored header the tier knows (``knowns[i]``), into ``outs[i]``
    for every ``i``: ``locate(i)`` gives its (fd, file offset), or None for a miss (an OSError
    leaves it to the general path); ``close``: the fds are the batch's to close. ``results[i]``
    gets the header of each block served (listed in ``served``). Returns the indices left to
    the general path."""
    redo: list[int] = []
    inflight: dict[int, tuple[int, int]] = {}  # i -> (slot, fd)
    scratch = slots.scratch

    def start(i: int) -> bool:
        stored = knowns[i].header.stored_len
        addr = buffer_address(outs[i], stored, writable=True)
        if not addr:
            redo.append(i)
            return False
        try:
            place = locate(i)
        except OSError:
            redo.append(i)
            return False
        if place is None:
            return False
        fd, at = place
        slot = slots.free.pop()
        bulk = stored // PAGE * PAGE
        inflight[i] = (slot, fd)
        slots.read_into.add(slot)
        addr = slots.stage_read(slot, bulk, addr)
        slots.prepare(i, slot, _uring.OP_READV, fd, addr, bulk, stored > bulk, at)
        return True

    def finish(i: int, res: int) -> None:
        slot, fd = inflight.pop(i)
        if close:
            os.close(fd)
        try:
            known = knowns[i]
            header = known.header
            stored = header.stored_len
            bulk = stored // PAGE * PAGE
            if res != PAGE + bulk + (PAGE if stored > bulk else 0):
                redo.append(i)
                return
            at = slot * SLOT
            if scratch[at : at + 128].tobytes() != known.head:
                redo.append(i)
                return
            out = outs[i]
            dst = out if type(out) is np.ndarray else np.frombuffer(out, np.uint8)
            if dst.ndim != 1:
                dst = dst.reshape(-1)
            staged = slots.staging.lent(slot)
            h = known.seed.copy()
            if bulk:
                h.update(dst[:bulk] if staged is None else staged)
            if stored > bulk:
                tail = scratch[at + PAGE : at + PAGE + stored - bulk]
                h.update(tail)
            if h.intdigest() != header.checksum:
                redo.append(i)
                return
            if staged is not None:  # only a checked block reaches the caller
                dst[:bulk] = staged
            if stored > bulk:
                dst[bulk:stored] = tail
            results[i] = header
            served.append(i)
        finally:
            slots.release(slot)

    slots.drive(len(knowns), start, finish)
    return redo


@dataclass(slots=True)
class WriteOp:
    """One block write the tier has set up: its file, header and payload."""

    fd: int
    head: bytes
    payload: memoryview  # the stored bytes (raw), one contiguous byte range
    addr: int  # where ``payload`` starts (page-aligned when the file is O_DIRECT)
    offset: int = 0  # where the block starts in the file


def write_blocks(
    slots: Slots,
    n: int,
    setup: Callable[[int], WriteOp | None],
    publish: Callable[[int, int], None],
) -> None:
    """Write op ``i`` for every i that ``setup(i)`` sets up; ``publish(i, res)`` after each
    (``res``: bytes written or ``-errno``), from the calling thread."""
    scratch = slots.scratch
    inflight: dict[int, int] = {}  # i -> slot

    def start(i: int) -> bool:
        op = setup(i)
        if op is None:
            return False
        slot = slots.free.pop()
        at = slot * SLOT
        if slot in slots.read_into:  # a read left a file's header page here: zero its padding
            slots.read_into.discard(slot)
            scratch[at + 128 : at + PAGE] = 0
        scratch[at : at + 128] = np.frombuffer(op.head, np.uint8)
        n = op.payload.nbytes
        bulk = n // PAGE * PAGE
        if n > bulk:
            tail = scratch[at + PAGE : at + SLOT]
            tail[: n - bulk] = np.frombuffer(op.payload, np.uint8, n - bulk, bulk)
            tail[n - bulk :] = 0
        inflight[i] = slot
        addr = slots.stage_write(slot, op.payload, bulk, op.addr)
        slots.prepare(i, slot, _uring.OP_WRITEV, op.fd, addr, bulk, n > bulk, op.offset)
        return True

    def finish(i: int, res: int) -> None:
        slots.release(inflight.pop(i))
        publish(i, res)

    slots.drive(n, start, finish)


class RawHeaders:
    """Headers of raw blocks of one namespace, as ``pack_block`` writes them, from a template
    per (dtype, shape, length): per block only the key, the value and the checksum change, so
    a header costs two byte joins and the payload hash, whose seed (the header with its
    checksum zeroed) comes along for the reads that follow."""

    def __init__(self, namespace: bytes):
        self.namespace = namespace
        self._templates: dict[tuple, tuple[bytes, bytes, bytes]] = {}

    def _template(self, meta: BlockMeta, n: int) -> tuple[bytes, bytes, bytes]:
        key = (meta.dtype, tuple(meta.shape), n)
        t = self._templates.get(key)
        if t is None:
            plain = BlockMeta(meta.dtype, tuple(meta.shape))
            head, _ = pack_block(self.namespace, bytes(16), np.zeros(n, np.uint8), plain)
            head = head[:CHECKSUM_OFFSET] + _ZERO8 + head[CHECKSUM_OFFSET + 8 :]
            t = (head[:KEY_OFFSET], head[KEY_OFFSET + 16 : VALUE_OFFSET], head[VALUE_OFFSET + 8 :])
            if len(self._templates) >= _MAX_TEMPLATES:
                self._templates.clear()
            self._templates[key] = t
        return t

    def pack(self, key: bytes, payload: memoryview, meta: BlockMeta) -> tuple[bytes, Known]:
        """The header of a raw block and what a read of it will need (``meta.codec`` raw)."""
        n = payload.nbytes
        pre, mid, tail = self._template(meta, n)
        head, checksum, seed = seal(pre + key + mid + _F64.pack(meta.value) + tail, payload)
        header = BlockHeader(self.namespace, key, meta, n, n, checksum)
        return head, Known(head, header, seed)


def seal(zeroed: bytes, stored) -> tuple[bytes, int, xxhash.xxh3_64]:
    """A header whose checksum field is zero, sealed: (the header with the xxh3 over it and
    ``stored`` in place, that checksum, the xxh3 state after the header alone for reads)."""
    h = xxhash.xxh3_64(zeroed)
    seed = h.copy()
    h.update(stored)
    checksum = h.intdigest()
    at = CHECKSUM_OFFSET
    head = zeroed[:at] + checksum.to_bytes(8, "little") + zeroed[at + 8 :]
    return head, checksum, seed


def seed_of(head: bytes) -> xxhash.xxh3_64:
    """The xxh3 state of a header with its checksum field zeroed (see ``kvtier.codec``)."""
    return xxhash.xxh3_64(head[:CHECKSUM_OFFSET] + _ZERO8 + head[CHECKSUM_OFFSET + 8 : 128])


__all__ = [
    "STAGING_BUDGET",
    "Known",
    "RawHeaders",
    "Slots",
    "Staging",
    "WriteOp",
    "buffer_address",
    "read_known",
    "seal",
    "seed_of",
    "write_blocks",
]
