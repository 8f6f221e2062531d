"""A chunk's shards across tensor-parallel ranks: one part per rank, each under a key of its own.

With tensor parallelism each rank's worker holds the KV of its own heads, so a chunk is stored
as one part per rank. A part's key is the chunk's key in that rank's namespace
(:meth:`kvtier.keys.Namespace.id` hashes ``tp_rank`` and ``tp_size``), so ranks never read each
other's parts and a chunk stored at one TP size is never read at another. The scheduler, which
has no rank, asks for every part of a chunk in one batched lookup and counts the chunk only
when all of them are there. With one rank a part's key is the chunk's key itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

import xxhash

from kvtier.cache.results import LookupResult
from kvtier.keys import Namespace

V = TypeVar("V")


@dataclass(frozen=True)
class Shards:
    """The parts of chunks keyed in ``namespace`` (the engine's), one per rank of its TP size."""

    namespace: Namespace
    _ids: tuple[bytes, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ns = replace(self.namespace, tp_rank=0)
        ids = tuple(replace(ns, tp_rank=r).id for r in range(ns.tp_size))
        object.__setattr__(self, "_ids", ids)

    @property
    def size(self) -> int:
        """Ranks, i.e. parts per chunk."""
        return len(self._ids)

    def key(self, key: bytes, rank: int) -> bytes:
        """The key of rank ``rank``'s part of chunk ``key``."""
        if self.size == 1:
            return key
        return xxhash.xxh3_128_digest(b"kvtier-part\x00" + self._ids[rank] + key)

    def keys(self, keys: Sequence[bytes], rank: int) -> list[bytes]:
        """The keys of rank ``rank``'s parts of ``keys``."""
        if self.size == 1:
            return list(keys)
        return [self.key(k, rank) for k in keys]

    def every_part(self, keys: Sequence[bytes]) -> list[bytes]:
        """Every rank's part of each chunk, chunk by chunk (rank order within a chunk)."""
        if self.size == 1:
            return list(keys)
        return [self.key(k, r) for k in keys for r in range(self.size)]

    def per_part(self, values: Sequence[V]) -> list[V]:
        """Each chunk's value once per part, in :meth:`every_part`'s order."""
        return [v for v in values for _ in range(self.size)]

    def whole(self, found: LookupResult) -> LookupResult:
        """A lookup of :meth:`every_part` as chunks: the leading chunks with every part found,
        each in the slowest tier any of its parts is in."""
        n = self.size
        if n == 1:
            return found
        whole = len(found.tiers) // n
        tiers = [max(found.tiers[c * n : (c + 1) * n]) for c in range(whole)]
        return replace(found, requested=found.requested // n, tiers=tiers)

    def partial(self, found: LookupResult) -> int | None:
        """The index of the chunk a lookup of :meth:`every_part` found only some parts of
        (leading parts present, a later one missing), if any."""
        n = self.size
        if n == 1 or len(found.tiers) % n == 0:
            return None
        return len(found.tiers) // n


class PartBook(Generic[V]):
    """What the newest ``capacity`` parts a half wrote belong to (thread-safe; by default their
    chunk's key), so that a tier's store or eviction of a part can name what it concerns."""

    def __init__(self, capacity: int = 1 << 20):
        self.capacity = capacity
        self._chunk_of: OrderedDict[bytes, V] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, parts: Sequence[bytes], chunks: Sequence[V]) -> None:
        """``parts[i]`` belongs to ``chunks[i]``."""
        with self._lock:
            for part, chunk in zip(parts, chunks, strict=True):
                self._chunk_of[part] = chunk
                self._chunk_of.move_to_end(part)
            while len(self._chunk_of) > self.capacity:
                self._chunk_of.popitem(last=False)

    def chunk(self, part: bytes) -> V | None:
        """What ``part`` belongs to, if remembered."""
        with self._lock:
            return self._chunk_of.get(part)

    def __len__(self) -> int:
        with self._lock:
            return len(self._chunk_of)


__all__ = ["PartBook", "Shards"]
