"""Host DRAM tier (``memory://``): blocks in a preallocated slot arena, one memcpy per read.

Every block (its 128-byte header, then the stored payload) lives in fixed-size slots of one
arena (``arena``): the slot size comes from ``slot=`` or, by default, from the first block put
(rounded up to 4 KiB), so same-sized KV chunks take one slot each; a payload of whole pages then
starts on the slot's second page, as aligned as the caller's buffers. A larger block spans
several slots. With a codec (``codec=``, off by default) blocks differ in size, so the default
slot is a sixteenth of the first block: a coded block takes the slots its stored size needs.
Slots are reused: no buffer is allocated per block on the hot path. The books
(index, bytes, eviction order) are a :class:`~kvtier.tiers.ledger.BlockLedger`, whose index is a
plain dict that readers look keys up in without the tier lock.

A read copies straight from the slot into the caller's buffer without the lock for the common
case (a raw block in one slot, a one-dimensional uint8 buffer of its length): it looks the
block up, copies, then checks that the block's slots were not freed meanwhile (``freed`` is set
under the lock before a slot can be reused) and that the stored header still equals the one
written; otherwise, and for every other case, it reads again under the lock, pinning the block
so that its slots outlive the copy. Unlocked reads reach the eviction policy through a queue
applied, in order, before the policy is next consulted. Process memory is trusted, so the
payload has no checksum (``verifies_checksum=False``: its header's checksum field is 0), but the
header comparison means a block of another namespace or key, or a damaged header, is never
served.

The one-block read runs in C where the package was built with its extension (``_fastget.c``,
``native=auto|1|0``): ``get_many_into`` is then the C entry itself, with no Python frame for a
one-block request; the Python path is the same logic and serves everything else. In Python a
block of at most ``gil_copy_max`` bytes is copied holding the GIL (shorter than a contended GIL
hand-off), larger ones with ``numpy.copyto``, which releases it. With torch imported and CUDA
available the arena is pinned (page-locked) memory; ``pin=0`` turns that off, ``pin=1``
requires it. A tier larger than the host's RAM is refused.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.codec import (
    HEADER_SIZE,
    BlockError,
    BlockHeader,
    BlockMeta,
    get_codec,
    parse_header,
)
from kvtier.codec.container import (
    RAW_META,
    BufferTooSmallError,
    CorruptBlockError,
    encode_payload,
    header_bytes,
)
from kvtier.errors import ConfigError
from kvtier.tiers.base import Tier, TierCapabilities, TierURL, TierUsage
from kvtier.tiers.io.buffers import PAGE, align_up, host_memory
from kvtier.tiers.ledger import BlockLedger
from kvtier.tiers.memory.arena import SlabArena, pinned_available
from kvtier.tiers.memory.options import GIL_COPY_MAX, MemoryOptions
from kvtier.tiers.url import parse_options

try:  # the one-block read in C (src/kvtier/tiers/memory/_fastget.c), built with the package
    from kvtier.tiers.memory._fastget import get1 as _native_get1
    from kvtier.tiers.memory._fastget import get_many as _native_get_many
except ImportError:  # not built here: the same path runs in Python
    _native_get1 = _native_get_many = None

_U8 = np.dtype(np.uint8)
#: Recency updates queued by unlocked reads before a reader applies them (the policy sees them
#: anyway before it next picks a victim). A drain holds the GIL in one go and readers that
#: finish a copy meanwhile queue behind it, so drains are rare and never waited for.
_TOUCH_MAX = 1024
_TOUCH_WAIT = 16 * _TOUCH_MAX  # ... and before a reader waits for the lock to apply them


#: With a codec, the default slot is this fraction of the first block (see ``_make_arena``).
CODED_SLOTS_PER_BLOCK = 16


@dataclass(slots=True, eq=False)
class _Block:
    slots: Sequence[int]  # a range when the block lies in one run of slots
    header: BlockHeader
    header_bytes: bytes
    head: np.ndarray  # the header as stored in the first slot
    parts: list[np.ndarray]  # the stored payload, in order, as views of the slots
    simple: bool  # raw payload in one slot: a read is a single copy
    whole: np.ndarray | None  # parts[0] when simple: what an unlocked read copies
    shape: tuple[int, ...] | None  # (raw length,) when simple: a uint8 buffer of that shape
    # takes one copy (numpy handles its strides); None otherwise
    small: memoryview | None  # ``whole`` when simple and at most ``gil_copy_max`` bytes
    pins: int = 0  # readers copying out of the slots right now (locked path)
    dead: bool = False  # dropped while pinned: the last reader frees the slots
    freed: bool = False  # the slots went back to the arena (may hold another block now)


@dataclass(slots=True, eq=False)
class _Lent:
    slots: Sequence[int]
    nbytes: int
    block: _Block | None = None  # set once a put stored it in place


class MemoryTier(Tier):
    """Blocks in host memory, bounded by ``capacity`` bytes of slots."""

    scheme = "memory"
    capabilities = TierCapabilities(persistent=False, shared=False, verifies_checksum=False)

    def __init__(
        self,
        namespace: bytes,
        capacity: int,
        *,
        eviction: str = "lru",
        slot_size: int | None = None,
        pin: bool | None = None,
        gil_copy_max: int = GIL_COPY_MAX,
        native: bool | None = None,
        name: str | None = None,
        codec: str = "raw",
    ):
        super().__init__(namespace, name or "memory", codec)
        if native and _native_get1 is None:
            raise ConfigError(
                "native=1: kvtier's C read path is not built here (reinstall kvtier with a C "
                "compiler); use native=auto or native=0"
            )
        self._get1 = _native_get1 if native is not False else None
        if gil_copy_max < 0:
            raise ConfigError(f"gil_copy_max must be 0 or more bytes, got {gil_copy_max}")
        self.gil_copy_max = gil_copy_max
        if capacity <= 0:
            raise ConfigError(f"memory tier capacity must be positive, got {capacity}")
        if slot_size is not None and not 0 < slot_size <= capacity:
            raise ConfigError(f"slot size {slot_size} must be between 1 byte and the capacity")
        ram = host_memory()
        if capacity > ram:
            raise ConfigError(
                f"memory:// size={capacity} bytes is more than this host's RAM ({ram} bytes); "
                "give a smaller size= or put the rest on a disk tier"
            )
        if pin and not _cuda_for_pinning():
            raise ConfigError("pin=1 needs torch with CUDA; use pin=0 or pin=auto")
        self.capacity = capacity
        self.pinned = pinned_available() if pin is None else bool(pin)
        self._slot_size = align_up(slot_size, 64) if slot_size else None
        self._lock = threading.Lock()
        self.ledger: BlockLedger[_Block] = BlockLedger(capacity, eviction)
        self._index = self.ledger.index  # never rebound: the C read path holds it
        self._touched: deque[bytes] = deque()  # reads not yet shown to the policy
        self._arena: SlabArena | None = None
        # lent slots by the address of the payload view handed out: slot, bytes, and the
        # block once a put committed it (pinned until the lender gives the view back)
        self._lent: dict[int, _Lent] = {}
        if self._slot_size:
            self._arena = SlabArena(capacity, self._slot_size, self.pinned)
        if self._get1 is not None and _native_get_many is not None:
            self.get_many_into = self._native_entry()  # type: ignore[method-assign]

    @classmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> MemoryTier:
        """``memory://?size=8GiB[&eviction=lru|arc|cost][&slot=1MiB][&pin=auto|1|0]
        [&gil_copy_max=256KiB][&native=auto|1|0]`` (see :class:`MemoryOptions`)."""
        return cls(namespace, **parse_options(MemoryOptions, url).tier_kwargs())

    # --- verbs -------------------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        return key in self._index

    def get_into(self, key: bytes, out) -> BlockHeader | None:
        block = self._index.get(key)  # a dict lookup is atomic: no lock for the common case
        if (
            block is not None
            and type(out) is np.ndarray
            and out.dtype is _U8
            and out.shape == block.shape
        ):
            if block.small is not None:
                memoryview(out)[:] = block.small  # a short copy: keeps the GIL (see above)
            else:
                np.copyto(out, block.whole)  # releases the GIL
            # valid only if the slots were not freed (and maybe refilled) meanwhile and the
            # header is intact; otherwise the locked path decides
            if not block.freed and block.head.tobytes() == block.header_bytes:
                touched = self._touched
                touched.append(key)  # atomic; the policy sees it before its next use
                if len(touched) > _TOUCH_MAX:
                    self._drain_soon()
                return block.header
        return self._get_locked(key, out)

    def _native_entry(self) -> Callable:
        """``get_many_into`` as one C call for one-block requests (the C code calls back into
        :meth:`get_many_into` for everything else). Its callbacks hold the tier weakly: no
        reference cycle keeps a dropped tier's arena alive."""
        me = weakref.ref(self)
        cls = type(self)

        def drain() -> None:
            tier = me()
            if tier is not None:
                tier._drain_soon()

        def slow(keys: Sequence[bytes], outs: Sequence) -> list:
            return cls.get_many_into(me(), keys, outs)  # type: ignore[arg-type]

        return functools.partial(
            _native_get_many, self._index, self._touched, _TOUCH_MAX, drain, slow
        )

    def _drain_soon(self) -> None:
        """Apply the queued recency updates now, unless another thread holds the lock: then
        it, or a later reader, does (readers never queue behind a drain; see ``_TOUCH_MAX``).
        Past ``_TOUCH_WAIT`` queued updates a reader waits, to bound the queue."""
        lock = self._lock
        if lock.acquire(blocking=len(self._touched) > _TOUCH_WAIT):
            try:
                self._drain_locked()
            finally:
                lock.release()

    def _drain_locked(self) -> None:
        """Show the policy the reads done without the lock, in order."""
        touched = self._touched
        if touched:
            popleft = touched.popleft
            self.ledger.touch_many([popleft() for _ in range(len(touched))])

    def _get_locked(self, key: bytes, out) -> BlockHeader | None:
        with self._lock:
            self._drain_locked()
            block = self._index.get(key)
            if block is None:
                return None
            block.pins += 1
            self.ledger.touch(key)
        try:
            return self._copy_out(key, block, out)
        finally:
            with self._lock:
                block.pins -= 1
                if block.dead and not block.pins:
                    self._free_slots_locked(block)

    def get_many_into(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        if len(keys) == 1 and len(outs) == 1:  # no loop (with the C entry, it tried C first)
            try:
                return [self.get_into(keys[0], outs[0])]
            except BlockError as exc:
                return [exc]
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        if all(type(o) is np.ndarray for o in outs):
            results: list[BlockHeader | BlockError | None] = []
            get, get1, index, touched = self.get_into, self._get1, self._index, self._touched
            for key, out in zip(keys, outs, strict=True):
                if get1 is not None:
                    got = get1(index, key, out, touched)
                    if got is not None:
                        results.append(got[0])
                        continue
                try:
                    results.append(get(key, out))
                except BlockError as exc:
                    results.append(exc)
            if len(touched) > _TOUCH_MAX:
                self._drain_soon()
            return results
        index, touch = self._index, self.ledger.touch
        with self._lock:  # one lock round trip for the whole batch
            self._drain_locked()
            blocks = [index.get(k) for k in keys]
            for key, block in zip(keys, blocks, strict=True):
                if block is not None:
                    block.pins += 1
                    touch(key)
        results = [None] * len(keys)
        try:
            for i, block in enumerate(blocks):
                if block is not None:
                    try:
                        results[i] = self._copy_out(keys[i], block, outs[i])
                    except BlockError as exc:
                        results[i] = exc
        finally:
            with self._lock:
                for block in blocks:
                    if block is not None:
                        self._unpin_locked(block)
        return results

    def put(self, key: bytes, payload, meta: BlockMeta = RAW_META) -> bool:
        if self._lent and type(payload) is np.ndarray:
            lent = self._lent.get(payload.ctypes.data)
            if lent is not None and lent.block is None and payload.nbytes == lent.nbytes:
                return self._commit(key, lent, payload, meta)
        header, stored = self._pack(key, memoryview(payload).cast("B"), self._coded(meta))
        total = HEADER_SIZE + stored.nbytes
        evicted: list[bytes] = []
        try:
            with self._lock:
                self._drain_locked()
                arena = self._arena or self._make_arena(total)
                need = max(1, -(-total // arena.slot_size))
                if need > 1:  # room for the payload to start on a page (see _copy_in)
                    need = -(-(PAGE + stored.nbytes) // arena.slot_size)
                slots = self._alloc_locked(arena, need)
                evicted = self.ledger.take_evicted()
            if slots is None:
                return False
            block = self._copy_in(arena, slots, header, stored)
            with self._lock:
                old = self.ledger.add(key, block, need * arena.slot_size, meta.value)
                if old is not None:
                    self._release_locked(old[0])
            return True
        finally:
            self._notify_evicted_many(evicted)

    def lend(self, nbytes: int) -> np.ndarray | None:
        """A writable, page-aligned buffer of ``nbytes`` in a free slot of the arena, or None
        (a coded tier; a block that does not fit one slot; no room). A later put of exactly
        this buffer stores it where it lies, without a copy, and keeps it pinned until
        :meth:`unlend`; a lent buffer never put is freed by :meth:`unlend`. The lender (a
        :class:`~kvtier.cache.StagingPool`) gives every lent buffer back once."""
        if self.codec != "raw" or nbytes < 1:
            return None
        evicted: list[bytes] = []
        try:
            with self._lock:
                self._drain_locked()
                arena = self._arena or self._make_arena(HEADER_SIZE + nbytes)
                if PAGE + nbytes > arena.slot_size:
                    return None
                slots = self._alloc_locked(arena, 1)
                evicted = self.ledger.take_evicted()
                if slots is None:
                    return None
                view = arena.view(slots[0])[PAGE : PAGE + nbytes]
                self._lent[view.ctypes.data] = _Lent(slots, nbytes)
                return view
        finally:
            self._notify_evicted_many(evicted)

    def unlend(self, buf: object) -> bool:
        """Take back a buffer from :meth:`lend` (False: not one this tier lent): unpin the
        block a put made of it, or free its slot when it was never put."""
        if not self._lent or type(buf) is not np.ndarray:
            return False
        with self._lock:
            lent = self._lent.pop(buf.ctypes.data, None)
            if lent is None:
                return False
            if lent.block is not None:
                self._unpin_locked(lent.block)
            elif self._arena is not None:
                self._arena.free(lent.slots)
                self.ledger.release(self._arena.slot_size)
            return True

    def _pack(self, key: bytes, raw: memoryview, meta: BlockMeta) -> tuple[bytes, memoryview]:
        """(header, stored payload) of a block: encoded with ``meta.codec``, its header's
        checksum left 0 (process memory is trusted and a read compares the whole header, so
        an xxh3 of the payload would be read by nothing)."""
        codec_id, meta, stored = encode_payload(raw, meta)
        head = header_bytes(self.namespace, key, meta, codec_id, raw.nbytes, stored.nbytes, 0)
        return head, stored

    def _commit(self, key: bytes, lent: _Lent, payload: np.ndarray, meta: BlockMeta) -> bool:
        """Store a lent buffer where it lies: its header in the slot's first bytes."""
        header, _ = self._pack(key, memoryview(payload).cast("B"), meta.with_codec("raw"))
        with self._lock:
            arena = self._arena
            if arena is None or self._lent.get(payload.ctypes.data) is not lent:
                return False  # closed, or given back meanwhile
            head = arena.view(lent.slots[0])[:HEADER_SIZE]
            head[:] = np.frombuffer(header, np.uint8)
            parsed = parse_header(header)
            small = memoryview(payload) if payload.nbytes <= self.gil_copy_max else None
            block = _Block(
                lent.slots, parsed, header, head, [payload], True, payload,
                (payload.nbytes,), small, pins=1,
            )  # fmt: skip
            lent.block = block
            old = self.ledger.add(key, block, arena.slot_size, meta.value)
            if old is not None:
                self._release_locked(old[0])
        return True

    def delete(self, key: bytes) -> bool:
        with self._lock:
            self._drain_locked()
            gone = self.ledger.pop(key)
            if gone is None:
                return False
            self._release_locked(gone[0])
            return True

    def usage(self) -> TierUsage:
        with self._lock:
            mapped = self._arena.mapped_bytes if self._arena else 0
            return TierUsage(
                self.ledger.used, self.capacity, len(self._index), footprint_bytes=mapped
            )

    def iter_keys(self) -> Iterator[bytes]:
        return iter(list(self._index))  # one C call: a consistent snapshot without the lock

    def close(self) -> None:
        with self._lock:
            self.ledger.clear()
            self._touched.clear()
            self._lent.clear()
            self._arena = None

    # --- introspection -----------------------------------------------------------------------
    @property
    def slot_size(self) -> int | None:
        """Bytes per slot (None until the first put when no ``slot=`` was given)."""
        return self._arena.slot_size if self._arena else self._slot_size

    @property
    def mapped_bytes(self) -> int:
        """Memory the arena has mapped so far (never more than the capacity)."""
        with self._lock:
            return self._arena.mapped_bytes if self._arena else 0

    def block_views(self, key: bytes) -> list[np.ndarray]:
        """The slots holding a block, header first (for inspection and fault-injection tests)."""
        with self._lock:
            block = self._index.get(key)
            if block is None or self._arena is None:
                return []
            return [self._arena.view(s) for s in block.slots]

    # --- internals ---------------------------------------------------------------------------
    def _make_arena(self, first_block: int) -> SlabArena:
        # coded blocks differ in size: slots of a sixteenth of the first one keep the rounding
        # of each block to whole slots small instead of rounding the codec's gain away
        share = 1 if self.codec == "raw" else CODED_SLOTS_PER_BLOCK
        slot = self._slot_size or min(max(PAGE, align_up(-(-first_block // share))), self.capacity)
        self._arena = SlabArena(self.capacity, slot, self.pinned)
        self.ledger.capacity = self.ledger.limit = self._arena.slots * slot
        return self._arena

    def _busy(self, key: bytes) -> bool:
        block = self._index.get(key)
        return (block is not None and block.pins > 0) or self.is_pinned(key)

    def _alloc_locked(self, arena: SlabArena, need: int) -> Sequence[int] | None:
        spill = self._spill_locked if self.spilling else None
        ok, _ = self.ledger.make_room(
            need * arena.slot_size, self._drop_victim, spill=spill, pinned=self._busy
        )
        return arena.alloc(need) if ok else None

    def _drop_victim(self, key: bytes, block: _Block, size: int) -> None:
        self._release_locked(block)  # a victim is never busy: its slots are free now

    def _spill_locked(self, key: bytes, block: _Block) -> None:
        out = np.empty(block.header.raw_len, np.uint8)
        try:
            header = self._copy_out(key, block, out)
        except CorruptBlockError:
            return  # a damaged block is not worth keeping anywhere
        self._notify_spilling(key, out, header.meta)

    def _unpin_locked(self, block: _Block) -> None:
        block.pins -= 1
        if block.dead and not block.pins:
            self._free_slots_locked(block)

    def _release_locked(self, block: _Block) -> None:
        if block.pins:
            block.dead = True  # the last reader frees the slots
        else:
            self._free_slots_locked(block)

    def _free_slots_locked(self, block: _Block) -> None:
        block.freed = True  # before any reuse: an unlocked reader that copied checks it after
        if self._arena is not None:  # None once closed
            self._arena.free(block.slots)
            self.ledger.release(len(block.slots) * self._arena.slot_size)

    def _copy_in(
        self, arena: SlabArena, slots: Sequence[int], header: bytes, stored: memoryview
    ) -> _Block:
        run = arena.span(slots) if len(slots) > 1 else None
        views = [run] if run is not None else [arena.view(s) for s in slots]
        head = views[0][:HEADER_SIZE]
        head[:] = np.frombuffer(header, np.uint8)
        src = np.frombuffer(stored, np.uint8)
        n, pos = src.nbytes, 0
        # a payload that leaves a page for the header in its slot (any payload of whole pages)
        # starts on a page, like the caller's buffers: a copy between buffers 128 bytes apart
        # runs slower
        first = PAGE if len(views) == 1 and PAGE + n <= views[0].nbytes else HEADER_SIZE
        parts = []
        for i, view in enumerate(views):
            room = view[first:] if i == 0 else view
            part = room[: min(room.nbytes, n - pos)]
            np.copyto(part, src[pos : pos + part.nbytes])
            parts.append(part)
            pos += part.nbytes
        parsed = parse_header(header)
        simple = len(parts) == 1 and parsed.meta.codec == "raw"
        if simple:
            whole = parts[0]
            small = memoryview(whole) if whole.nbytes <= self.gil_copy_max else None
            return _Block(slots, parsed, header, head, parts, True, whole, (whole.nbytes,), small)
        return _Block(slots, parsed, header, head, parts, False, None, None, None)

    def _copy_out(self, key: bytes, block: _Block, out) -> BlockHeader:
        """Copy a pinned block's payload into ``out`` (the hot path: keep it short)."""
        if block.head.tobytes() != block.header_bytes:
            parse_header(block.head, self.namespace, key)  # raises the precise BlockError
            raise CorruptBlockError("block header changed in memory since it was written")
        header = block.header
        if type(out) is np.ndarray and out.dtype == _U8 and out.flags.c_contiguous:
            dst = out if out.ndim == 1 else out.reshape(-1)
        else:
            dst = np.frombuffer(memoryview(out).cast("B"), np.uint8)
        parts = block.parts
        if block.simple and dst.nbytes == header.raw_len:  # one slot, exact buffer: one memcpy
            np.copyto(dst, parts[0])
            return header
        if dst.nbytes < header.raw_len:
            raise BufferTooSmallError(
                f"buffer of {dst.nbytes} bytes cannot hold a {header.raw_len}-byte block"
            )
        if header.meta.codec == "raw":
            pos = 0
            for part in parts:
                np.copyto(dst[pos : pos + part.nbytes], part)
                pos += part.nbytes
            return header
        stored = parts[0] if len(parts) == 1 else np.concatenate(parts)
        got = get_codec(header.meta.codec).decode_into(
            memoryview(stored), memoryview(dst).cast("B")[: header.raw_len], header.meta.dtype
        )
        if got != header.raw_len:
            raise CorruptBlockError(f"block decoded to {got} bytes, header says {header.raw_len}")
        return header


def _cuda_for_pinning() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
