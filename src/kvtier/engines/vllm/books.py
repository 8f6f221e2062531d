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

from kvtier.cache import CacheConfig, TieredCache
from kvtier.cache.config import TierOptions
from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.keys import Namespace
from kvtier.tiers.base import TierURL
from kvtier.tiers.registry import open_tier
from kvtier.tiers.url import replace_options

#: Where a directory tier is host memory (tmpfs) rather than a disk.
HOST_MEMORY_DIRS = ("/dev/shm/",)


def tier_url(url: str) -> str:
    """``url`` of a tier in host memory (/dev/shm) with a name that says so (``host``, unless it
    has a ``name=``) and, unless it has a ``codec=``, stored raw like ``memory://`` (host
    memory is fast enough that decoding would cost more than the bytes it saves)."""
    parsed = TierURL.parse(url)
    if parsed.scheme not in ("slab", "file"):
        return url
    path = parsed.path if parsed.path.endswith("/") else parsed.path + "/"
    if not path.startswith(HOST_MEMORY_DIRS):
        return url
    changes = {k: v for k, v in (("name", "host"), ("codec", "raw")) if k not in parsed.options}
    return replace_options(url, **changes) if changes else url


def open_cache(
    config: ConnectorConfig, namespace: Namespace, role: str, chunk_bytes: int
) -> TieredCache:
    """The TieredCache of one half (``role``: ``scheduler`` or ``worker``) over chunks of
    ``chunk_bytes``."""
    n = len(config.tiers)
    if role == "scheduler":
        opts = [TierOptions("through", promote=True)] + [TierOptions("none")] * (n - 1)
    else:
        rest = "back" if config.write == "back" else "through"
        opts = [TierOptions("through", promote=True)] + [TierOptions(rest)] * (n - 1)
    tiers = []
    try:
        for url in config.tiers:
            tiers.append(open_tier(tier_url(url), namespace.id))
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


__all__ = ["open_cache"]
