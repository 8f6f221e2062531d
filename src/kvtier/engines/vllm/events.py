"""kvtier's stores and evictions as vLLM KV events, for routers that score engines by prefix.

A prefix-aware router (llm-d's KV-cache indexer, Dynamo's router) follows vLLM's KV events
(``--kv-events-config``) to know which engine holds which blocks. With kvtier, a block evicted
from vLLM's pool may still sit in host memory or on disk at a fraction of its recompute cost, so
kvtier announces its own: a ``BlockStored`` when a chunk lands in a tier and a ``BlockRemoved``
when it leaves one, named by vLLM's own block hashes (never kvtier's keys), with the tier's
``medium`` (``CPU`` for host memory, ``STORAGE`` otherwise), ``locality`` (``REMOTE`` for a
shared tier) and the tier's name as ``ownership``. Events of the worker half (which writes the
tiers) reach the scheduler half through vLLM's channel for them; there a chunk counts as stored
once every rank reported its part, and as removed once any rank lost its part. The scheduler
half's own preloads into host memory (every rank's part at once) join them the same way.
They go out with the engine's steps, as vLLM's own do: what lands while the engine is idle
(a lower tier's write behind a finished request) is announced at its next step.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
)
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from kvtier.cache import TieredCache
from kvtier.engines.vllm.metadata import ChunkBlocks
from kvtier.engines.vllm.open_tiers import in_host_memory
from kvtier.engines.vllm.shards import PartBook

#: Events a half keeps waiting for the other ranks' parts (the oldest are dropped past it).
PENDING_EVENTS = 1 << 16


def chunk_blocks(
    request: Any, chunk: int, blocks_per_chunk: int, block_size: int
) -> ChunkBlocks | None:
    """Chunk ``chunk`` of ``request`` in vLLM's block hashes (None where vLLM has not hashed
    all its blocks)."""
    hashes = list(getattr(request, "block_hashes", ()) or ())
    first, end = chunk * blocks_per_chunk, (chunk + 1) * blocks_per_chunk
    if len(hashes) < end:
        return None
    size = block_size * blocks_per_chunk
    tokens = tuple(int(t) for t in request.all_token_ids[chunk * size : (chunk + 1) * size])
    lora = getattr(request, "lora_request", None)
    return ChunkBlocks(
        hashes=tuple(maybe_convert_block_hash(h) for h in hashes[first:end]),
        parent=maybe_convert_block_hash(hashes[first - 1]) if first else None,
        tokens=tokens,
        lora_name=getattr(lora, "lora_name", None) if lora is not None else None,
    )


@dataclass(frozen=True)
class TierPlace:
    """Where a tier keeps blocks, in the words of vLLM's KV events."""

    name: str
    medium: str
    locality: str

    @classmethod
    def of(cls, url: str, name: str, shared: bool) -> TierPlace:
        """The place of the tier at ``url`` (named ``name``; ``shared`` across hosts)."""
        host = in_host_memory(url) or url.startswith("memory:")
        return cls(name, MEDIUM_CPU if host else MEDIUM_STORAGE, "REMOTE" if shared else "LOCAL")


class KVTierEvents(KVConnectorKVEvents):
    """The events one step's workers send the scheduler half (vLLM merges all ranks' into one)."""

    def __init__(self, events: Sequence[KVCacheEvent] = (), workers: int = 1):
        self._events = list(events)
        self._workers = workers

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._events.extend(events)

    def aggregate(self) -> KVTierEvents:
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self) -> list[KVCacheEvent]:
        return list(self._events)

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        self._events.clear()


class CacheEvents:
    """One half's announcer: what its cache's tiers store and drop of the parts it was told
    of (the worker's stores and loads, the scheduler's preloads)."""

    def __init__(self, cache: TieredCache, urls: Sequence[str], block_size: int):
        self.block_size = block_size
        self.places = {
            name: TierPlace.of(url, name, tier.capabilities.shared)
            for name, url, tier in zip(cache.names, urls, cache.tiers, strict=True)
        }
        self._known: PartBook[ChunkBlocks] = PartBook(PENDING_EVENTS)
        self._events: list[KVCacheEvent] = []
        self._lock = threading.Lock()
        cache.add_write_listener(self._on_write)
        cache.add_eviction_listener(self._on_evicted)

    def expect(self, parts: Sequence[bytes], blocks: Sequence[ChunkBlocks | None]) -> None:
        """``parts`` are about to be stored or loaded: announce them as they land or leave."""
        named = [(p, b) for p, b in zip(parts, blocks, strict=True) if b is not None]
        if named:
            self._known.remember([p for p, _ in named], [b for _, b in named])

    def _on_write(self, tier: str, stored: list[bytes], deleted: list[bytes]) -> None:
        place = self.places[tier]
        out: list[KVCacheEvent] = []
        for part in stored:
            b = self._known.chunk(part)
            if b is not None:
                out.append(
                    BlockStored(
                        block_hashes=list(b.hashes),
                        parent_block_hash=b.parent,
                        token_ids=list(b.tokens),
                        block_size=self.block_size,
                        lora_id=None,
                        medium=place.medium,
                        lora_name=b.lora_name,
                        locality=place.locality,
                        ownership=place.name,
                    )
                )
        gone = (self._known.chunk(p) for p in deleted)
        out += [self._removed(place, b) for b in gone if b is not None]
        if out:
            with self._lock:
                self._events.extend(out)

    def _on_evicted(self, tier: str, part: bytes) -> None:
        b = self._known.chunk(part)
        if b is not None:
            event = self._removed(self.places[tier], b)
            with self._lock:
                self._events.append(event)

    @staticmethod
    def _removed(place: TierPlace, b: ChunkBlocks) -> BlockRemoved:
        return BlockRemoved(
            block_hashes=list(b.hashes),
            medium=place.medium,
            locality=place.locality,
            ownership=place.name,
        )

    def take(self) -> KVTierEvents | None:
        """The events since the last call (None when there are none)."""
        with self._lock:
            events, self._events = self._events, []
        return KVTierEvents(events) if events else None


class SchedulerEvents:
    """The scheduler half's merge of every rank's events: a chunk is announced stored once all
    ``ranks`` reported its part (across steps), removed as soon as one rank lost its part."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self._stored: OrderedDict[BlockStored, int] = OrderedDict()
        self._gone: OrderedDict[tuple, None] = OrderedDict()  # removals already announced
        self._out: list[KVCacheEvent] = []

    def add(self, events: KVConnectorKVEvents | None) -> None:
        """One step's events of every rank."""
        if events is None:
            return
        for event in events.get_all_events():
            if isinstance(event, BlockStored):
                self._add_stored(event)
            elif isinstance(event, BlockRemoved):
                self._add_removed(event)

    def _add_stored(self, event: BlockStored) -> None:
        count = self._stored.pop(event, 0) + 1
        if count < self.ranks:
            self._stored[event] = count
            while len(self._stored) > PENDING_EVENTS:
                self._stored.popitem(last=False)
            return
        self._gone.pop(_place_of(event), None)
        self._out.append(event)

    def _add_removed(self, event: BlockRemoved) -> None:
        place = _place_of(event)
        if place in self._gone:
            return
        self._gone[place] = None
        while len(self._gone) > PENDING_EVENTS:
            self._gone.popitem(last=False)
        self._out.append(event)

    def take(self) -> list[KVCacheEvent]:
        """The events to publish since the last call."""
        out, self._out = self._out, []
        return out


def _place_of(event: BlockStored | BlockRemoved) -> tuple:
    return (tuple(event.block_hashes), event.medium, event.ownership)


__all__ = [
    "CacheEvents",
    "KVTierEvents",
    "SchedulerEvents",
    "TierPlace",
    "chunk_blocks",
]
