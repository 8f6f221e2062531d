"""The tiers each half of the connector opens, and how each half writes them.

Both halves open the same tier URLs, each as its own :class:`~kvtier.cache.TieredCache`: the
books are the tiers themselves. ``slab://`` tiers are safe to share between live processes (each
writes only its own files and reads the others' after a rescan), so what the worker stores the
scheduler finds, and what the scheduler preloads into host memory the worker reads. The worker
writes new chunks (through every tier, or only the first with ``write=back``) and promotes what
it loads from slower tiers; the scheduler writes nothing but the preloads it moves up into the
first tier.
"""

from __future__ import annotations

from dataclasses import fields

from kvtier.cache import CacheConfig, TieredCache
from kvtier.cache.config import TierOptions
from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.keys import Namespace
from kvtier.tiers.base import TierURL
from kvtier.tiers.registry import open_tier, options_class, replace_options

#: Where a directory tier is host memory (tmpfs) rather than a disk.
HOST_MEMORY_DIRS = ("/dev/shm/",)


def tier_url(url: str) -> str:
    """``url`` as the connector opens it: a tier in host memory (/dev/shm) named ``host`` unless
    it has a ``name=``, and every tier stored raw unless its URL names a ``codec=``.

    Raw by default: the connector's loads sit on a request's way to its first token, and on a
    CPU host decoding runs slower than a local disk reads raw blocks (``kvtier bench codec``
    against ``kvtier bench storage``), so a codec trades latency for capacity: ask for it
    (``codec=kv``) where capacity is what is short."""
    parsed = TierURL.parse(url)
    changes: dict[str, str] = {}
    cls = options_class(parsed.scheme)
    if cls is None:  # a tier without typed options: opened as given
        return url
    if "codec" not in parsed.options and "codec" in {f.name for f in fields(cls)}:
        changes["codec"] = "raw"
    if "name" not in parsed.options and in_host_memory(url):
        changes["name"] = "host"
    return replace_options(url, **changes) if changes else url


def in_host_memory(url: str) -> bool:
    """Whether ``url`` is a directory tier in host memory (tmpfs)."""
    parsed = TierURL.parse(url)
    path = parsed.path if parsed.path.endswith("/") else parsed.path + "/"
    return parsed.scheme in ("slab", "file") and path.startswith(HOST_MEMORY_DIRS)


def open_cache(
    config: ConnectorConfig, namespace: Namespace, role: str, chunk_bytes: int
) -> TieredCache:
    """The TieredCache of one half (``role``: ``scheduler`` or ``worker``) over chunks of
    ``chunk_bytes``. The worker takes the room of its tiers in host memory when it opens them
    (when the engine starts, as vLLM takes its KV pool), and writes it once: a tmpfs page is
    allocated and zeroed on its first write, and otherwise that would happen in the thread
    that stores chunks, taking CPU from the forwards. Each half also gives its tiers the I/O
    buffers of the threads that will read and write them (the worker: the two halves of a load
    the engine waits for, or its background loads, and the store; the scheduler: the preloader),
    so that no request's load waits while those are mapped."""
    n = len(config.tiers)
    if role == "scheduler":
        callers = 1 if config.preload else 0
        opts = [TierOptions("through", promote=True)] + [TierOptions("none")] * (n - 1)
    else:
        callers = max(2, config.load_workers) + 1
        rest = "back" if config.write == "back" else "through"
        opts = [TierOptions("through", promote=True)] + [TierOptions(rest)] * (n - 1)
    tiers = []
    try:
        for url in config.tiers:
            tier = open_tier(tier_url(url), namespace.id)
            tiers.append(tier)
            if role == "worker" and in_host_memory(url):
                tier.reserve(chunk_bytes, touch=True)
            tier.warm_io(chunk_bytes, callers)
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    cache_config = CacheConfig(
        chunk_tokens=config.chunk_tokens,
        tiers=tuple(opts),
        queue_chunks=config.queue_chunks,
        prefetch_pin_s=0.0,
        block_bytes=chunk_bytes,
    )
    return TieredCache(tiers, cache_config)


def close_cache(cache: TieredCache) -> None:
    """Close a cache :func:`open_cache` made, then the tiers it opened for it."""
    cache.close()
    for tier in cache.tiers:
        tier.close()


__all__ = ["close_cache", "open_cache"]
