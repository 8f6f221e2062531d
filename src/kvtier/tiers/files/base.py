"""What every tier on a local filesystem shares: ``FileTier``.

A file tier keeps its blocks under ``<directory>/<namespace hex>/`` and its books in a
:class:`~kvtier.tiers.ledger.BlockLedger`. The base owns the directory (checked usable when the
tier opens), the ``direct=`` resolution (O_DIRECT where the filesystem takes it, else buffered
with a note), ``sync=``, the I/O backend and its ring staging budget, the notes shown in
``usage()``, the batched get/put driver over the backend, eviction with spill, the handling of a
filesystem that fills up before ``size=``, and the :class:`IOProfile` that
benchmarks read. A subclass gives what differs: how it locates, plans and checks a read, plans
and publishes a write, retires a block and recovers its books on open.

A full filesystem (ENOSPC, EDQUOT, or no inodes left) lowers the ledger's limit to what the tier
holds then, so later writes evict to make room as they would at ``size=``; while lowered, the
limit follows the filesystem's free space again, checked at most once a second. Out of inodes,
``file://`` also removes a file (and an emptied folder) for each one a write needs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from kvtier.codec import BlockError, BlockHeader, BlockMeta, BufferTooSmallError
from kvtier.codec.container import RAW_META, Encoded, encode_payload, stored_raw
from kvtier.codec.parallel import Decoders, EncodeAhead
from kvtier.errors import ConfigError
from kvtier.tiers.base import Tier, TierCapabilities, TierURL, TierUsage
from kvtier.tiers.files.options import FileTierOptions
from kvtier.tiers.io import batch as _short
from kvtier.tiers.io.backends import IOBackend, IOOp, UringIO, make_backend, run_inline
from kvtier.tiers.io.batch import buffer_address
from kvtier.tiers.io.buffers import PAGE, BufferPool, address, host_memory
from kvtier.tiers.io.direct import O_DIRECT, resolve_direct
from kvtier.tiers.ledger import BlockLedger
from kvtier.tiers.paths import usable_directory
from kvtier.tiers.url import parse_options

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DSYNC = getattr(os, "O_DSYNC", 0)
#: errno values that mean the filesystem has no room (blocks, quota or inodes).
NOSPACE = (errno.ENOSPC, errno.EDQUOT)
#: Seconds between checks of the filesystem's free space while the limit is lowered.
SPACE_CHECK_S = 1.0
#: Reads of coded blocks a batch keeps in flight beyond its decode threads: none, so one read
#: per decoder. Reads in flight share the disk, so the more there are, the later each of them
#: finishes while the decoders wait; the I/O loop queues the next read the moment one
#: finishes, so the disk still streams.
READS_AHEAD = 0

Plan = Callable[[int], tuple[Any, IOOp] | None]
Finish = Callable[[Any, int], Any]


class BlockIOError(BlockError):
    """The device failed to read a block (EIO …): served as a miss, like a damaged block."""


@dataclass(frozen=True)
class IOProfile:
    """How a tier on a local filesystem does its I/O, declared for benchmarks that compare it
    with fio doing the same: engine, O_DIRECT, O_DSYNC, depth, and the file layout."""

    directory: Path
    ioengine: str  # fio's name for the tier's engine: "io_uring" or "psync"
    direct: bool
    sync: bool
    depth: int  # operations the tier keeps in flight itself
    layout: Literal["file", "per-block"]  # slots of one preallocated file, or a file per block
    page: int = 4096  # a block is one header page, then its payload padded to whole pages

    def file_bytes(self, payload: int) -> int:
        """Bytes a block with ``payload`` stored bytes takes in its file."""
        return self.page + -(-payload // self.page) * self.page


class FileTier(Tier):
    """A tier whose blocks live in files under one directory (see the module docstring)."""

    capabilities = TierCapabilities(persistent=True, shared=False, verifies_checksum=True)
    options: ClassVar[type[FileTierOptions]]  # the typed options of the tier's URL
    layout: ClassVar[str]  # fio's layout for the same I/O: "file" (one file) or "per-block"
    pool_per_depth: ClassVar[int] = 2  # pooled scratch buffers kept per op in flight
    ring_batch_min: ClassVar[int] = 1  # raw writes a batch needs to take the ring batch path
    align = PAGE

    def __init__(
        self,
        namespace: bytes,
        directory: str | os.PathLike,
        capacity: int,
        *,
        eviction: str = "lru",
        admit_after: int = 1,
        io: str = "auto",
        depth: int = 8,
        staging: int | None = None,
        direct: bool | None = None,
        sync: bool = True,
        name: str | None = None,
        codec: str = "kv",
    ):
        super().__init__(namespace, name or self.default_name, codec)
        if capacity <= 0:
            raise ConfigError(f"{self.scheme}:// tier size must be positive, got {capacity}")
        if staging is not None and staging < 0:
            raise ConfigError(f"{self.scheme}:// staging budget must be 0 or more, got {staging}")
        self.directory = Path(directory)
        self.root = usable_directory(self.directory / namespace.hex(), f"{self.scheme}:// tier")
        self.capacity = capacity
        self.admit_after = admit_after
        self.sync = sync
        self.notes: list[str] = []
        self.ledger: BlockLedger = BlockLedger.admitting_after(capacity, eviction, admit_after)
        self._index = self.ledger.index  # read without the lock: dict lookups are atomic
        self._lock = threading.RLock()
        self._pool = BufferPool(keep=self.pool_per_depth * depth + 4)
        self._space_checked = 0.0
        self.direct, refusal = resolve_direct(direct, self.root, str(self.directory))
        if refusal:
            self._note(refusal)
        self._oflags = O_DIRECT if self.direct else 0
        self.staging = self._staging_budget(staging)
        self.io: IOBackend = make_backend(io, depth)
        self._decoders = Decoders()  # coded blocks' checks and decodes, on every core
        self.ioengine = self.io.ioengine

    default_name: ClassVar[str] = "disk"

    @classmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> FileTier:
        """Open the tier a ``scheme:///directory?size=…`` URL describes (see its options)."""
        return cls(namespace, **parse_options(cls.options, url).tier_kwargs())

    # --- shared verbs -------------------------------------------------------------------------
    def get_into(self, key: bytes, out) -> BlockHeader | None:
        planned = self._plan_read(key, out)
        if planned is None:
            return None
        read, op = planned
        return self._finish_read(read, run_inline(op))

    def put(self, key: bytes, payload, meta: BlockMeta = RAW_META) -> bool:
        return self.put_many([(key, payload, meta)])[0]

    def iter_keys(self) -> Iterator[bytes]:
        with self._lock:
            keys = list(self._index)
        return iter(keys)

    def usage(self) -> TierUsage:
        with self._lock:
            used, blocks = self.ledger.used, len(self._index)
            footprint = self._footprint_locked()
        return TierUsage(used, self.capacity, blocks, tuple(self.notes), footprint)

    @property
    def io_profile(self) -> IOProfile:
        """How this tier does its I/O (what fio must do to compare with it)."""
        return IOProfile(
            directory=self.directory,
            ioengine=self.ioengine,
            direct=self.direct,
            sync=self.sync,
            depth=self.io.depth,
            layout=self.layout,  # type: ignore[arg-type]
            page=self.align,
        )

    # --- what a subclass gives ----------------------------------------------------------------
    def _plan_read(self, key: bytes, out) -> tuple[Any, IOOp] | None:
        """(read state, the op) for the general read path; None on a miss."""
        raise NotImplementedError

    def _finish_read(self, read: Any, res: int) -> BlockHeader | None:
        """Check a read op's result (``res``: bytes or ``-errno``): the header, None, or raise."""
        raise NotImplementedError

    def _drop(self, key: bytes, entry: Any, size: int) -> None:
        """A block left the books (evicted or deleted): free or keep its room in the ledger."""
        raise NotImplementedError

    def _footprint_locked(self) -> int | None:
        """Bytes the tier takes on disk now (files, kept room, preallocated slots)."""
        return self.ledger.used + self.ledger.kept

    def _reclaim_locked(self) -> int:
        """Give one piece of kept room back to the filesystem; its bytes (0: none)."""
        return 0

    def _reuse_locked(self, size: int) -> Any:
        """Kept room of exactly ``size`` bytes for a write (a token), or None."""
        return None

    # --- the batched driver -------------------------------------------------------------------
    def _batch(
        self,
        todo: Sequence[int],
        plan: Plan,
        finish: Finish,
        results: list,
        *,
        inline: bool,
        decodes: bool = False,
    ) -> None:
        """Run the op ``plan(i)`` gives for each ``i`` in ``todo`` through the backend, then
        ``results[i] = finish(state, res)``. A BlockError is the block's result; any other
        error is raised once the batch is done (every op finished). ``inline``: one op runs in
        the calling thread (nothing to overlap). ``decodes``: the ops read blocks that
        ``finish`` decodes."""
        states: dict[int, Any] = {}
        errors: list[Exception] = []

        def prepare(j: int) -> IOOp | None:
            i = todo[j]
            try:
                planned = plan(i)
            except BlockError as exc:
                results[i] = exc
                return None
            except Exception as exc:
                errors.append(exc)
                return None
            if planned is None:
                return None
            states[j], op = planned
            return op

        def complete(j: int, res: int) -> None:
            i = todo[j]
            try:
                results[i] = finish(states.pop(j), res)
            except BlockError as exc:
                results[i] = exc
            except Exception as exc:
                errors.append(exc)

        # Coded blocks on a backend that completes in this thread: their checks and decodes go
        # to the decode threads (all cores), and this thread goes on driving the I/O.
        handed: list[tuple[int, Future]] = []
        in_flight: int | None = None  # None: the backend's own depth
        if self.codec != "raw" and self.io.completes_inline and self._decoders.parallel:

            def hand_over(j: int, res: int) -> None:
                handed.append((j, self._decoders.submit(complete, j, res)))

            on_done: Callable[[int, int], None] = hand_over
            if decodes:
                in_flight = self._decoders.threads + READS_AHEAD
        else:
            on_done = complete
        if inline and len(todo) == 1:
            op = prepare(0)
            if op is not None:
                complete(0, run_inline(op))
        elif todo:
            try:
                self.io.run(len(todo), prepare, on_done, in_flight)
            finally:
                for _, fut in handed:  # complete() keeps its errors: this only waits
                    fut.exception()
        if errors:
            raise errors[0]

    def _coded_items(
        self, items: Sequence[tuple[bytes, object, BlockMeta]]
    ) -> Sequence[tuple[bytes, object, BlockMeta]]:
        """``items`` naming this tier's codec, or ``raw`` for blocks it is known not to shrink
        (random bytes …): those take the raw write path, as in a raw tier."""
        items = super()._coded_items(items)
        if self.codec == "raw":
            return items
        return [(k, p, stored_raw(p, m)) for k, p, m in items]

    def _write_batch(
        self,
        items: Sequence[tuple[bytes, object, BlockMeta]],
        todo: Sequence[int],
        plan: Callable[[bytes, object, BlockMeta, Encoded | None], tuple[Any, IOOp] | None],
        finish: Finish,
        results: list,
        *,
        inline: bool,
    ) -> None:
        """``_batch`` over the writes ``todo`` of ``items``: ``plan(key, payload, meta,
        encoded)`` gets each block's encode_payload, run on the codec threads a few blocks
        ahead of the I/O where there is something to overlap (a coded tier, several blocks,
        several cores), else None (``plan`` encodes it)."""
        ahead: EncodeAhead | None = None
        if self.codec != "raw" and len(todo) > 1 and self._decoders.parallel:

            def encode(i: int) -> Encoded:
                _, payload, meta = items[i]
                return encode_payload(memoryview(payload).cast("B"), meta)

            ahead = EncodeAhead(self._decoders, todo, encode, 2 * self._decoders.threads)
        try:
            self._batch(
                todo,
                lambda i: plan(*items[i], ahead.get(i) if ahead else None),
                finish,
                results,
                inline=inline,
            )
        finally:
            if ahead is not None:
                ahead.cancel()

    def _read_batch(self, keys: Sequence[bytes], outs: Sequence, todo: Sequence[int], results):
        """The general read path for ``todo``'s indices."""
        self._batch(
            todo,
            lambda i: self._plan_read(keys[i], outs[i]),
            self._finish_read,
            results,
            inline=True,
            decodes=True,
        )

    def warm_io(self, block_bytes: int, callers: int) -> None:
        """Give ``callers`` io_uring rings their scratch slots and staging for blocks of
        ``block_bytes`` now: mapping and faulting in a ring's huge-page staging takes a
        noticeable pause, otherwise paid by the first read or write through each ring."""
        io = self.io
        if not isinstance(io, UringIO) or callers < 1 or block_bytes <= 0 or self.staging <= 0:
            return
        rings = [io.take_ring() for _ in range(callers)]
        try:
            for ring in rings:
                _short.Slots.of(ring, io.depth, self.staging).staging.prepare(block_bytes)
        finally:
            for ring in rings:
                io.give_ring(ring)

    @contextlib.contextmanager
    def _ring_slots(self) -> Iterator[_short.Slots]:
        """A ring of the io_uring backend and its scratch slots, for one batch."""
        io = self.io
        assert isinstance(io, UringIO)
        ring = io.take_ring()
        try:
            yield _short.Slots.of(ring, io.depth, self.staging)
        finally:
            io.give_ring(ring)

    @staticmethod
    def _results(keys: Sequence[bytes], outs: Sequence) -> list:
        """The results list of a batched read (one None per key), once the sizes agree."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        return [None] * len(keys)

    def _write_failed(self, key: bytes, res: int) -> bool:
        """A write that moved ``res`` bytes (or ``-errno``) but not the block: False for a
        short, cancelled or out-of-room write (the filesystem full: see ``_out_of_space``);
        other errors raise."""
        if res >= 0 or -res == errno.ECANCELED:
            return False
        if -res in NOSPACE:
            self._out_of_space()
            return False
        raise OSError(-res, f"writing block {key.hex()}: {os.strerror(-res)}")

    def _ring_writes(
        self, items: Sequence[tuple[bytes, object, BlockMeta]], results: list
    ) -> list[int]:
        """Write the raw blocks of a batch through the ring batch path (``io.batch``), each
        set up by ``_ring_write_op`` and published by ``_ring_written``; the indices left to
        the general path (other codecs, unaligned payloads)."""
        everything = list(range(len(items)))
        if not isinstance(self.io, UringIO):
            return everything
        todo = [i for i, item in enumerate(items) if item[2].codec == "raw"]
        if not todo or len(todo) < self.ring_batch_min:
            return everything
        rest = [i for i, item in enumerate(items) if item[2].codec != "raw"]
        pending: dict[int, Any] = {}
        errors: list[Exception] = []
        direct = self.direct

        def setup(j: int) -> _short.WriteOp | None:
            i = todo[j]
            key, payload, meta = items[i]
            try:
                stored = memoryview(payload).cast("B")
                addr = buffer_address(stored, 0, writable=False) if direct else address(stored)
                if not addr:
                    rest.append(i)  # an unaligned payload: the general path copies it
                    return None
                made = self._ring_write_op(key, stored, meta, addr)
            except Exception as exc:
                errors.append(exc)
                return None
            if made is None:
                return None
            op, pending[j] = made
            return op

        def publish(j: int, res: int) -> None:
            try:
                results[todo[j]] = self._ring_written(items[todo[j]][0], pending.pop(j), res)
            except Exception as exc:
                errors.append(exc)

        with self._ring_slots() as slots:
            _short.write_blocks(slots, len(todo), setup, publish)
        if errors:
            raise errors[0]
        rest.sort()
        return rest

    def _ring_write_op(
        self, key: bytes, stored: memoryview, meta: BlockMeta, addr: int
    ) -> tuple[_short.WriteOp, Any] | None:
        """Admit and place a raw block for the ring batch path: (its op, state for
        ``_ring_written``), or None when it is not admitted or finds no room."""
        raise NotImplementedError

    def _ring_written(self, key: bytes, state: Any, res: int) -> bool:
        """Publish a block the ring batch path wrote (``res``: bytes or ``-errno``)."""
        raise NotImplementedError

    # --- room ---------------------------------------------------------------------------------
    def _make_room_locked(self, size: int) -> tuple[bool, Any]:
        """Reserve ``size`` bytes in the ledger: (room?, kept room reused)."""
        self._follow_free_space_locked()
        pinned = self.is_pinned if self._pinned is not None else None
        return self.ledger.make_room(
            size,
            self._drop,
            reuse=self._reuse_locked,
            reclaim=self._reclaim_locked,
            spill=self._spill if self.spilling else None,
            pinned=pinned,
        )

    def _out_of_space(self) -> None:
        """The filesystem refused a write for lack of room: evict from now on, as at size=."""
        with self._lock:
            if self.ledger.full():
                self._note(
                    f"the filesystem under {self.directory} filled up before size="
                    f"{self.capacity} bytes: the tier evicts to fit in what it holds, and "
                    "grows back as the filesystem frees room"
                )
            self._space_checked = time.monotonic()

    def _follow_free_space_locked(self) -> None:
        """While the limit is lowered, raise it to what the filesystem can take now."""
        ledger = self.ledger
        if ledger.limit >= ledger.capacity:
            return
        now = time.monotonic()
        if now - self._space_checked < SPACE_CHECK_S:
            return
        self._space_checked = now
        try:
            st = os.statvfs(self.root)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if st.f_files and not st.f_favail:
            free = 0  # no inodes left: no new file fits
        ledger.set_limit(max(ledger.limit, ledger.used + ledger.kept + free - 8 * PAGE))

    def _staging_budget(self, staging: int | None) -> int:
        """Bytes of ring staging: ``staging=`` (None: the default budget), within the tier's
        size and the host's memory; a budget asked for beyond those is clamped with a note."""
        if staging is None:
            return min(_short.STAGING_BUDGET, self.capacity)
        limit, what = min((self.capacity, "the tier's size"), (host_memory(), "the host's RAM"))
        if staging > limit:
            self._note(f"staging={staging} bytes is more than {what}; using {limit}")
            return limit
        return staging

    # --- leaving blocks -----------------------------------------------------------------------
    def _spill(self, key: bytes, entry: Any) -> None:
        """Hand the victim's payload to spill listeners (a bad block is dropped silently)."""
        try:
            got = self._read_victim(key, entry)
        except (OSError, BlockError, BufferTooSmallError):
            return
        if got is not None:
            self._notify_spilling(key, got[0], got[1].meta)

    def _read_victim(self, key: bytes, entry: Any) -> tuple[Any, BlockHeader] | None:
        """A held block's payload and header, read for a spill (no recency update)."""
        raise NotImplementedError

    def delete(self, key: bytes) -> bool:
        with self._lock:
            gone = self.ledger.pop(key)
            if gone is None:
                return self._delete_unbooked_locked(key)
            self._drop(key, *gone)
            return True

    def _delete_unbooked_locked(self, key: bytes) -> bool:
        """Delete a block the books do not hold (another process's); True if one was there."""
        return False

    # --- setup --------------------------------------------------------------------------------
    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            warnings.warn(f"kvtier {self.scheme}:// tier: {text}", RuntimeWarning, stacklevel=3)

    def _rw_flags(self, write_only: bool = False) -> int:
        mode = os.O_WRONLY if write_only else os.O_RDWR
        return mode | _O_CLOEXEC | self._oflags | (_O_DSYNC if self.sync else 0)

    def _notify_evictions(self) -> None:
        """Notify eviction listeners of what the ledger evicted (call without the lock)."""
        with self._lock:
            evicted = self.ledger.take_evicted()
        self._notify_evicted_many(evicted)


__all__ = ["NOSPACE", "BlockIOError", "FileTier"]
