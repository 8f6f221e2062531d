"""What ``kvtier bench peers`` moves KV through: one small interface, kvtier's side of it and the
raw references (a plain copy, redis-py).

A :class:`System` stores a prompt's KV (the engine's KV of its tokens, whole chunks back to
back), answers how many of its tokens a fresh lookup finds, retrieves them into a destination
buffer and forgets them. kvtier's side is the product's path: chunk keys from the token ids
(:class:`~kvtier.keys.ChunkKeyer`), one :class:`~kvtier.cache.TieredCache` over the tier,
each chunk copied out of the engine's KV into a buffer of its own and queued with ``store``
(as the vLLM connector's worker does), ``load`` straight into the destination. The references
keep the bytes as they are, under plain names, with no keys, checks or headers.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kvtier.errors import KvtierError

#: The tier classes compared, in the order the report shows them.
HOST_MEMORY, LOCAL_DISK, REDIS, MOONCAKE = "host memory", "local disk", "redis", "mooncake"
TIER_CLASSES = (HOST_MEMORY, LOCAL_DISK, REDIS, MOONCAKE)
#: Who a system is: kvtier, a peer users choose instead, or the raw floor of the medium.
KVTIER, PEER, REFERENCE = "kvtier", "peer", "reference"
#: How often a wait for stored chunks asks again.
POLL_S = 0.0002


class PeersError(KvtierError):
    """A system lost or corrupted chunks, or did not store them in time."""


@dataclass(frozen=True)
class Geometry:
    """The KV of one model as the bench moves it: bytes per token, chunk shape and dtype."""

    model: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    chunk_tokens: int

    @property
    def bytes_per_token(self) -> int:
        """Raw KV bytes of one token (K and V of every layer)."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def chunk_bytes(self) -> int:
        """Raw bytes of one chunk."""
        return self.bytes_per_token * self.chunk_tokens

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """A chunk as kvtier lays it out: (layers, 2, kv_heads, chunk_tokens, head_dim)."""
        return (self.layers, 2, self.kv_heads, self.chunk_tokens, self.head_dim)

    def as_dict(self) -> dict:
        """Plain JSON-ready dict, with the derived sizes."""
        return {
            **asdict(self),
            "bytes_per_token": self.bytes_per_token,
            "chunk_bytes": self.chunk_bytes,
        }


@dataclass
class Prompt:
    """One request: its token ids and the engine's KV for them (``kv``: whole chunks, back to
    back, as bytes). ``ident`` names it for the references, which keep no keys of tokens."""

    ident: int
    tokens: np.ndarray  # uint32
    kv: np.ndarray  # uint8, n_chunks × chunk_bytes
    chunk_tokens: int
    torch_tokens: object = None  # the same ids as a torch tensor, made once for LMCache

    @property
    def n_tokens(self) -> int:
        """Tokens of the prompt (whole chunks)."""
        return len(self.tokens)

    @property
    def n_chunks(self) -> int:
        """Chunks of the prompt."""
        return self.n_tokens // self.chunk_tokens

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk."""
        return self.kv.nbytes // max(1, self.n_chunks)

    def chunk(self, i: int, of: np.ndarray | None = None) -> np.ndarray:
        """Chunk ``i`` of the prompt's KV (or of ``of``, a buffer laid out the same way)."""
        data = self.kv if of is None else of
        size = self.chunk_bytes
        return data[i * size : (i + 1) * size]


def bad_chunks(prompt: Prompt, out: np.ndarray) -> list[int]:
    """Chunks of ``out`` that differ from what was stored (all bytes compared)."""
    return [
        i
        for i in range(prompt.n_chunks)
        if not np.array_equal(prompt.chunk(i), prompt.chunk(i, out))
    ]


def drop_page_cache(directory: Path) -> int:
    """Write back and drop the page cache of every file under ``directory`` (posix_fadvise
    DONTNEED, file by file: other processes' cached files stay), so the next read comes from
    the device; the number of files dropped."""
    dropped = 0
    advise = getattr(os, "posix_fadvise", None)
    if advise is None or not directory.is_dir():
        return 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return dropped


class System(ABC):
    """One store under test: kvtier over a tier, a peer, or a raw reference."""

    name: str
    tier_class: str
    side: str
    #: Reads may come from the page cache: cold reads drop it first, warm reads are timed too.
    page_cache: bool = False

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.detail: str = ""

    @abstractmethod
    def store(self, prompt: Prompt) -> None:
        """Start storing ``prompt``'s chunks (a system may finish in the background)."""

    @abstractmethod
    def seen(self, prompt: Prompt) -> int:
        """Tokens of ``prompt`` a fresh lookup finds now (the hit prefix)."""

    @abstractmethod
    def retrieve(self, prompt: Prompt, out: np.ndarray) -> int:
        """Read ``prompt``'s KV into ``out`` (laid out as ``prompt.kv``); tokens retrieved."""

    @abstractmethod
    def forget(self, prompts: Sequence[Prompt]) -> None:
        """Remove what was stored for ``prompts``."""

    def settle(self, prompts: Sequence[Prompt], timeout_s: float) -> None:
        """Return once a fresh lookup finds every chunk of ``prompts`` (a chunk counts as
        stored from then on); PeersError past ``timeout_s``."""
        deadline = time.perf_counter() + timeout_s
        for prompt in prompts:
            while self.seen(prompt) < prompt.n_tokens:
                if time.perf_counter() > deadline:
                    raise PeersError(
                        f"{self.name}: {prompt.n_tokens - self.seen(prompt)} tokens of a stored "
                        f"prompt not found {timeout_s:.0f} s later"
                    )
                time.sleep(POLL_S)

    def prepare(self, buffers: Sequence[np.ndarray]) -> None:
        """Get ready to move data from and into ``buffers`` (untimed: e.g. register them)."""
        return None

    def held_bytes(self) -> int | None:
        """Bytes the system holds now for what it stored (None when it cannot say)."""
        return None

    def drop_page_cache(self) -> None:
        """Make the next read cold: drop the page cache of the system's files."""
        return None

    def close(self) -> None:
        """Release what the system opened."""
        return None


@dataclass
class KvtierSystem(System):
    """kvtier over one tier URL: keys from token ids, a TieredCache, the connector's copies."""

    name: str
    tier_class: str
    url: str
    geometry: Geometry
    queue_chunks: int = 1024
    directory: Path | None = None  # a disk tier's folder, whose page cache a cold read drops
    side: str = KVTIER
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from kvtier.cache import CacheConfig, StagingPool, TieredCache
        from kvtier.codec import BlockMeta
        from kvtier.keys import ChunkKeyer, Namespace
        from kvtier.specs import get_model
        from kvtier.tiers import open_tier

        geo = self.geometry
        namespace = Namespace.for_model(get_model(geo.model), "kvtier-bench-peers")
        self.tier = open_tier(self.url, namespace.id)
        config = CacheConfig(
            chunk_tokens=geo.chunk_tokens,
            queue_chunks=self.queue_chunks,
            block_bytes=geo.chunk_bytes,
        )
        self.cache = TieredCache([self.tier], config)
        # save buffers as a library user keeps them: a memory:// tier's slots where it lends
        # them (the chunk is copied once, into its place), else reused buffers
        self.staging = StagingPool.within(geo.chunk_bytes, lender=self.cache.lender())
        self.keyer = ChunkKeyer(namespace, geo.chunk_tokens)
        self.meta = BlockMeta(geo.dtype, geo.chunk_shape)
        self.page_cache = self.directory is not None
        self.detail = f"{self.url} (codec={self.tier.codec})"

    def store(self, prompt: Prompt) -> None:
        keys = self.keyer.keys(prompt.tokens)
        bufs = self.staging.take(len(keys))
        for i, buf in enumerate(bufs):  # the worker copies each chunk out of the engine's KV
            np.copyto(buf, prompt.chunk(i))
        taken = self.cache.store(keys, bufs, self.meta, copy=False, release=self.staging.give)
        if taken < len(keys):
            raise PeersError(
                f"{self.name}: its write queue took {taken} of {len(keys)} chunks; "
                "lower --prefix-tokens or --requests"
            )

    def seen(self, prompt: Prompt) -> int:
        return self.cache.lookup(self.keyer.keys(prompt.tokens)).hit_tokens

    def settle(self, prompts: Sequence[Prompt], timeout_s: float) -> None:
        self.cache.flush(timeout_s)
        super().settle(prompts, timeout_s)

    def retrieve(self, prompt: Prompt, out: np.ndarray) -> int:
        keys = self.keyer.keys(prompt.tokens)
        outs = [prompt.chunk(i, out) for i in range(len(keys))]
        return self.cache.load(keys, outs).loaded * prompt.chunk_tokens

    def forget(self, prompts: Sequence[Prompt]) -> None:
        self.cache.flush(30.0)
        keys = [k for p in prompts for k in self.keyer.keys(p.tokens)]
        self.tier.delete_many(keys)

    def held_bytes(self) -> int | None:
        return self.tier.usage().used_bytes

    def drop_page_cache(self) -> None:
        if self.directory is not None:
            drop_page_cache(self.directory)

    def close(self) -> None:
        self.cache.close()
        self.tier.close()


class CopyReference(System):
    """The floor of host memory: each chunk copied into a slot of a preallocated pool, and
    back out into the destination (numpy copies, no keys, no headers)."""

    side = REFERENCE
    tier_class = HOST_MEMORY

    def __init__(self, chunk_bytes: int, slots: int):
        super().__init__()
        self.name = "memcpy"
        self.pool = np.ones((slots, chunk_bytes), dtype=np.uint8)  # touched: no first faults
        self.free = list(range(slots))
        self.where: dict[tuple[int, int], int] = {}
        self.detail = "numpy.copyto into and out of a preallocated pool"

    def store(self, prompt: Prompt) -> None:
        for i in range(prompt.n_chunks):
            slot = self.free.pop()
            np.copyto(self.pool[slot], prompt.chunk(i))
            self.where[(prompt.ident, i)] = slot

    def seen(self, prompt: Prompt) -> int:
        n = 0
        while n < prompt.n_chunks and (prompt.ident, n) in self.where:
            n += 1
        return n * prompt.chunk_tokens

    def retrieve(self, prompt: Prompt, out: np.ndarray) -> int:
        for i in range(prompt.n_chunks):
            np.copyto(prompt.chunk(i, out), self.pool[self.where[(prompt.ident, i)]])
        return prompt.n_tokens

    def forget(self, prompts: Sequence[Prompt]) -> None:
        for p in prompts:
            for i in range(p.n_chunks):
                slot = self.where.pop((p.ident, i), None)
                if slot is not None:
                    self.free.append(slot)

    def held_bytes(self) -> int | None:
        return len(self.where) * self.pool.shape[1]

    def close(self) -> None:
        self.pool = np.empty((0, 0), dtype=np.uint8)


class RedisReference(System):
    """The floor of a Redis server: redis-py as it comes, one SET per chunk (a pipeline per
    prompt), GET back (a pipeline) and a copy into the destination."""

    side = REFERENCE
    tier_class = REDIS

    def __init__(self, url: str):
        super().__init__()
        import redis

        self.name = "redis-py GET"
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=30)
        self.detail = f"redis-py SET/GET, a pipeline per prompt, {url}"

    def _name(self, prompt: Prompt, i: int) -> str:
        return f"peers-raw:{prompt.ident}:{i}"

    def store(self, prompt: Prompt) -> None:
        pipe = self.client.pipeline(transaction=False)
        for i in range(prompt.n_chunks):
            pipe.set(self._name(prompt, i), memoryview(prompt.chunk(i)))
        pipe.execute()

    def seen(self, prompt: Prompt) -> int:
        pipe = self.client.pipeline(transaction=False)
        for i in range(prompt.n_chunks):
            pipe.exists(self._name(prompt, i))
        found = pipe.execute()
        n = 0
        while n < len(found) and found[n]:
            n += 1
        return n * prompt.chunk_tokens

    def retrieve(self, prompt: Prompt, out: np.ndarray) -> int:
        pipe = self.client.pipeline(transaction=False)
        for i in range(prompt.n_chunks):
            pipe.get(self._name(prompt, i))
        got = 0
        for i, value in enumerate(pipe.execute()):
            if value is None:
                break
            np.copyto(prompt.chunk(i, out), np.frombuffer(value, dtype=np.uint8))
            got += 1
        return got * prompt.chunk_tokens

    def forget(self, prompts: Sequence[Prompt]) -> None:
        names = [self._name(p, i) for p in prompts for i in range(p.n_chunks)]
        for k in range(0, len(names), 512):
            self.client.delete(*names[k : k + 512])

    def held_bytes(self) -> int | None:
        return redis_value_bytes(self.client)

    def close(self) -> None:
        self.client.close()


def redis_value_bytes(client) -> int:
    """The bytes of every value a Redis server holds (STRLEN summed over a SCAN): what one
    system stored where it has the server to itself."""
    total = 0
    names = list(client.scan_iter(count=1000))
    for k in range(0, len(names), 512):
        pipe = client.pipeline(transaction=False)
        for name in names[k : k + 512]:
            pipe.strlen(name)
        total += sum(int(n) for n in pipe.execute())
    return total


__all__ = [
    "HOST_MEMORY",
    "KVTIER",
    "LOCAL_DISK",
    "MOONCAKE",
    "PEER",
    "REDIS",
    "REFERENCE",
    "TIER_CLASSES",
    "CopyReference",
    "Geometry",
    "KvtierSystem",
    "PeersError",
    "Prompt",
    "RedisReference",
    "System",
    "bad_chunks",
    "drop_page_cache",
    "redis_value_bytes",
]
