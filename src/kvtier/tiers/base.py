"""The Tier contract: a few verbs over checksummed, self-describing blocks, plus batched forms.

Every tier is opened for one namespace (16-byte id): a block of another namespace is never served.
``get_into`` writes a block's raw payload into a caller-provided buffer. A block that fails its
checks raises a :class:`~kvtier.codec.BlockError`; the cache counts it as a miss and deletes it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

from kvtier.codec import BlockError, BlockHeader, BlockMeta, get_codec
from kvtier.codec.container import RAW_META
from kvtier.errors import ConfigError

EvictionListener = Callable[[bytes], None]
SpillListener = Callable[[bytes, memoryview, BlockMeta], None]
PinPredicate = Callable[[bytes], bool]


@dataclass(frozen=True)
class TierCapabilities:
    """What a tier can promise. The cache and the conformance suite read these flags."""

    persistent: bool = False
    shared: bool = False
    verifies_checksum: bool = True
    evicts: bool = True


@dataclass(frozen=True)
class TierUsage:
    """Bytes held (headers included), the capacity bound, and the number of blocks.

    ``notes`` carries warnings worth showing an operator (e.g. a disk tier that fell back to
    buffered I/O because its filesystem refuses O_DIRECT). ``footprint_bytes`` is what the tier
    takes from its medium now (memory mapped, disk blocks allocated: files, kept room and
    preallocated slots included), which may exceed ``used_bytes``; None when not known.
    """

    used_bytes: int
    capacity_bytes: int
    blocks: int
    notes: tuple[str, ...] = ()
    footprint_bytes: int | None = None


@dataclass(frozen=True)
class TierURL:
    """A parsed tier URL: ``scheme://host/path?opt=value``."""

    scheme: str
    netloc: str
    path: str
    options: dict[str, str]

    @classmethod
    def parse(cls, url: str) -> TierURL:
        parts = urlparse(url)
        if not parts.scheme:
            raise ConfigError(f"tier URL {url!r} has no scheme; e.g. memory://?size=8GiB")
        opts = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        return cls(parts.scheme, parts.netloc, parts.path, opts)


class Tier(contextlib.AbstractContextManager, ABC):
    """One storage medium holding KV blocks for one namespace."""

    scheme: ClassVar[str]
    capabilities: ClassVar[TierCapabilities]

    def __init__(self, namespace: bytes, name: str | None = None, codec: str = "raw"):
        if len(namespace) != 16:
            raise ConfigError("a tier needs the 16-byte namespace id (Namespace.id)")
        self.namespace = namespace
        self.name = name or self.scheme
        #: The codec the tier stores blocks with (``codec=``); the header of each block records
        #: the one used (raw where the codec did not gain).
        self.codec = get_codec(codec).name
        self._eviction_listeners: list[EvictionListener] = []
        self._spill_listeners: list[SpillListener] = []
        self._pinned: PinPredicate | None = None

    @classmethod
    @abstractmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> Tier:
        """Open the tier a URL describes."""

    # --- single-block verbs -------------------------------------------------------------
    @abstractmethod
    def contains(self, key: bytes) -> bool:
        """Whether a block for ``key`` is held (not verified)."""

    @abstractmethod
    def get_into(self, key: bytes, out) -> BlockHeader | None:
        """Decode the block for ``key`` into ``out``; None on a miss; BlockError if bad."""

    @abstractmethod
    def put(self, key: bytes, payload, meta: BlockMeta = RAW_META) -> bool:
        """Store a block; False when it was not admitted (too large, no room, admission filter)."""

    @abstractmethod
    def delete(self, key: bytes) -> bool:
        """Remove a block; True if one was there."""

    @abstractmethod
    def usage(self) -> TierUsage:
        """Current bytes, capacity and block count."""

    @abstractmethod
    def iter_keys(self) -> Iterator[bytes]:
        """Keys of the blocks held now (a snapshot)."""

    # --- batched forms (override where the medium can do better) -----------------------
    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """``contains`` for many keys."""
        return [self.contains(k) for k in keys]

    def get_many_into(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        """``get_into`` for many keys; a bad block yields its BlockError in place, not a raise."""
        results: list[BlockHeader | BlockError | None] = []
        for key, out in zip(keys, outs, strict=True):
            try:
                results.append(self.get_into(key, out))
            except BlockError as exc:
                results.append(exc)
        return results

    def put_many(self, items: Sequence[tuple[bytes, object, BlockMeta]]) -> list[bool]:
        """``put`` for many (key, payload, meta) triples."""
        return [self.put(k, p, m) for k, p, m in items]

    def delete_many(self, keys: Sequence[bytes]) -> list[bool]:
        """``delete`` for many keys."""
        return [self.delete(k) for k in keys]

    # --- life cycle ---------------------------------------------------------------------
    def add_eviction_listener(self, listener: EvictionListener) -> None:
        """Call ``listener(key)`` after the tier evicts a block to make room."""
        self._eviction_listeners.append(listener)

    def _notify_evicted(self, key: bytes) -> None:
        for listener in self._eviction_listeners:
            listener(key)

    def _notify_evicted_many(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            self._notify_evicted(key)

    def add_spill_listener(self, listener: SpillListener) -> None:
        """Call ``listener(key, payload, meta)`` just BEFORE evicting a block (for write-back).

        ``payload`` is a read-only view of the raw (decoded) bytes, valid only during the call;
        the listener copies what it keeps, returns quickly and never calls back into this tier.
        """
        self._spill_listeners.append(listener)

    @property
    def spilling(self) -> bool:
        """Whether anyone listens for spills (a tier may skip decoding victims when not)."""
        return bool(self._spill_listeners)

    def _coded(self, meta: BlockMeta) -> BlockMeta:
        """``meta`` naming this tier's codec: a tier stores every block with its own codec,
        whatever the block was stored with where it came from."""
        return meta.with_codec(self.codec)

    def _coded_items(
        self, items: Sequence[tuple[bytes, object, BlockMeta]]
    ) -> Sequence[tuple[bytes, object, BlockMeta]]:
        """``items`` with each meta naming this tier's codec."""
        if all(m.codec == self.codec for _, _, m in items):
            return items
        return [(k, p, self._coded(m)) for k, p, m in items]

    def _notify_spilling(self, key: bytes, payload, meta: BlockMeta) -> None:
        view = memoryview(payload).toreadonly()
        for listener in self._spill_listeners:
            listener(key, view, meta)

    def set_pinned(self, pinned: PinPredicate | None) -> None:
        """Install the predicate of pinned keys (the cache's leases): never evict those."""
        self._pinned = pinned

    def is_pinned(self, key: bytes) -> bool:
        """Whether ``key`` is pinned; an evicting tier skips such victims (put may then fail)."""
        pinned = self._pinned
        return pinned is not None and pinned(key)

    def reserve(self, block_bytes: int, touch: bool = False) -> int:
        """Take the room of blocks of ``block_bytes`` now rather than write by write (a tier
        that grows its storage as it fills; ``touch``: also write it once, so that memory
        behind it is allocated now); the bytes taken, 0 where there is nothing to do."""
        return 0

    def refresh(self) -> bool:
        """Bring what this tier knows of blocks other processes wrote up to date now, however
        recently it last looked (a reader was promised blocks it has not listed yet); True if
        it looked. Tiers that always ask their store have nothing to refresh."""
        return False

    def warm_io(self, block_bytes: int, callers: int) -> None:
        """Make the I/O buffers of ``callers`` concurrent readers or writers of blocks of
        ``block_bytes`` now (when an engine starts), so that the first reads and writes do not
        map and fault them in; nothing where a tier keeps no such buffers."""

    def close(self) -> None:
        """Release files, sockets and threads."""

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
