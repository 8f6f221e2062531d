"""What the scheduler side tells the worker side each step: which chunks to load, which to store.

The scheduler side owns the decisions (what kvtier holds, what to load, what is new); the worker
side owns the paged KV and moves bytes. Everything here is plain data (keys as bytes, block ids
as ints), so it crosses vLLM's process boundary whatever transport vLLM uses.

A chunk covers ``chunk_tokens`` tokens: ``chunk_tokens / block_size`` consecutive vLLM blocks of
the request. A load may need only part of its first chunk (vLLM's own prefix cache already holds
the leading blocks) or of its last (vLLM computes at least the prompt's last token itself):
``skip`` leading blocks of the chunk are not written and ``block_ids`` name only the blocks that
are. With more than one KV-cache group (vLLM's hybrid manager), ``groups`` holds the block ids
of every group (``block_ids`` is the first's); a sliding-window group's ids may be vLLM's null
block, which is never written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

try:  # the base classes exist only where vLLM is installed; the data is plain either way
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorMetadata,
        KVConnectorWorkerMetadata,
    )
except ImportError:  # pragma: no cover - used without vLLM only by tests of the plain data

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in base when vLLM is absent."""

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        """Stand-in base when vLLM is absent."""


@dataclass(frozen=True)
class ChunkBlocks:
    """A chunk as vLLM's prefix cache knows it, for KV events: its blocks' hashes (external
    form), the hash of the block before it, its token ids and the LoRA adapter's name."""

    hashes: tuple[Any, ...]
    parent: Any
    tokens: tuple[int, ...]
    lora_name: str | None = None


@dataclass(frozen=True)
class ChunkLoad:
    """Read chunk ``key`` and write its blocks ``skip:skip+len(block_ids)`` into ``block_ids``
    (``groups``: into each KV-cache group's, where there are several; ``blocks``: the chunk in
    vLLM's hashes, where KV events are on)."""

    key: bytes
    block_ids: tuple[int, ...]
    skip: int = 0
    blocks: ChunkBlocks | None = None
    groups: tuple[tuple[int, ...], ...] = ()

    def group_ids(self, group: int) -> tuple[int, ...]:
        """The block ids of KV-cache group ``group``."""
        return self.groups[group] if self.groups else self.block_ids


@dataclass(frozen=True)
class LoadJob:
    """One request's load: its chunks in order (a failed chunk stops the rest)."""

    req_id: str
    chunks: tuple[ChunkLoad, ...]
    tiers: tuple[int, ...]  # where the scheduler found each chunk (fast→slow index)
    sync: bool = False  # loaded before this step's forward (the request runs in this step)

    @property
    def tiers_per_chunk(self) -> bool:
        """Whether ``tiers`` names each chunk's tier (a load may then read each chunk there
        without locating it again)."""
        return len(self.tiers) == len(self.chunks)

    @property
    def block_ids(self) -> list[int]:
        """The blocks this load writes in the first KV-cache group, in order."""
        return [b for c in self.chunks for b in c.block_ids]

    def all_block_ids(self, chunks: tuple[ChunkLoad, ...] | None = None) -> list[int]:
        """Every block of every group that ``chunks`` (all by default) write, null blocks left
        out: what vLLM recomputes when they fail."""
        out: list[int] = []
        for c in self.chunks if chunks is None else chunks:
            for ids in c.groups or (c.block_ids,):
                out.extend(b for b in ids if b != 0)
        return out


@dataclass(frozen=True)
class StoreJob:
    """New full chunks of one request, computed by this step: ``keys[i]`` lives in the
    request's blocks ``block_ids[i]`` (a chunk's worth of block ids each); ``blocks[i]``: the
    chunk in vLLM's hashes, where KV events are on; ``groups[i]``: chunk ``i``'s block ids in
    every KV-cache group, where there are several."""

    req_id: str
    keys: tuple[bytes, ...]
    block_ids: tuple[tuple[int, ...], ...]
    values: tuple[float, ...] = ()
    blocks: tuple[ChunkBlocks | None, ...] = ()
    groups: tuple[tuple[tuple[int, ...], ...], ...] = ()

    def group_ids(self, chunk: int, group: int) -> tuple[int, ...]:
        """Chunk ``chunk``'s block ids in KV-cache group ``group``."""
        return self.groups[chunk][group] if self.groups else self.block_ids[chunk]


@dataclass
class KVTierMetadata(KVConnectorMetadata):
    """One step's loads and stores, built by the scheduler side; ``discards``: (chunk key, tier
    name) of chunks some rank lost its part of in that tier (evicted; ``""``: in every tier, a
    part a lookup found missing), whose parts every rank deletes from the same tier; ``flush``:
    vLLM preempted a request this step, so blocks may change hands: saves still copying finish
    before the forward."""

    loads: list[LoadJob] = field(default_factory=list)
    stores: list[StoreJob] = field(default_factory=list)
    prefill: tuple[int, int] | None = None  # (new, cached) when one request prefills alone
    discards: list[tuple[bytes, str]] = field(default_factory=list)
    flush: bool = False


@dataclass
class KVTierWorkerMeta(KVConnectorWorkerMetadata):
    """What the worker side tells the scheduler side after a step, through vLLM's channel for
    it: loads finished inside the step (``synced``: request id, seconds), and measurements for
    the cost model (``prefills``: new tokens, cached tokens, forward seconds; ``loads``: tier,
    bytes, seconds, chunks), and whether blocks landed in or left its tiers since its last
    report (``changed``: what a lookup answers may have changed), and the chunks whose part a
    tier evicted (``evicted``: chunk key, tier name; with tensor parallelism the other ranks'
    parts leave that tier too)."""

    synced: list[tuple[str, float]] = field(default_factory=list)
    prefills: list[tuple[int, int, float]] = field(default_factory=list)
    loads: list[tuple[str, int, float, int]] = field(default_factory=list)
    changed: bool = False
    evicted: list[tuple[bytes, str]] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVTierWorkerMeta:
        """Both workers' reports of one step, as one."""
        if not isinstance(other, KVTierWorkerMeta):
            return self
        return KVTierWorkerMeta(
            self.synced + other.synced,
            self.prefills + other.prefills,
            self.loads + other.loads,
            self.changed or other.changed,
            self.evicted + other.evicted,
        )

    def __bool__(self) -> bool:
        return bool(self.synced or self.prefills or self.loads or self.changed or self.evicted)


__all__ = ["ChunkBlocks", "ChunkLoad", "KVTierMetadata", "KVTierWorkerMeta", "LoadJob", "StoreJob"]
