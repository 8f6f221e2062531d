"""LMCache's storage engine as a library, for ``kvtier bench peers``: its local CPU, local disk and
Redis backends on the same KV kvtier stores.

LMCache's vLLM connector cannot run on a CPU-only host, but its engine can
(``LMCacheEngineBuilder.get_or_create`` with ``store``/``lookup``/``retrieve`` of token ids). It
moves KV between the serving engine and its memory objects through a ``GPUConnectorInterface``;
:class:`CPUKVConnector` is the bench's own: it copies a chunk's bytes between the prompt's KV
(a CPU buffer, chunks back to back) and LMCache's memory object, as they lie (LMCache's own
``MockGPUConnector`` copies nothing). It lives here, in the instruments, never in the product.

One engine per backend, each alone in its config: ``local_cpu`` (the hot cache) for host
memory; ``local_cpu=False`` with ``local_disk`` or ``remote_url`` for the others, whose CPU
memory is then only LMCache's staging buffer. Usage telemetry is off (``LMCACHE_TRACK_USAGE``,
``DO_NOT_TRACK``) and its log quiet unless ``LMCACHE_LOG_LEVEL`` says otherwise.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtier.bench.peers_systems import (
    HOST_MEMORY,
    LOCAL_DISK,
    PEER,
    REDIS,
    Geometry,
    Prompt,
    System,
    drop_page_cache,
    redis_value_bytes,
)
from kvtier.errors import KvtierError

#: What installs LMCache beside vLLM's CPU build (its declared dependencies include CUDA ones).
INSTALL = "pip install --no-deps -r requirements/peers.txt (LMCache 0.5.6 and what it imports)"
BACKENDS = ("local_cpu", "local_disk", "redis")
GiB = 1024**3


class PeerUnavailable(KvtierError):
    """A peer cannot run here (not installed, or it failed to start); the message is one line."""


def _quiet_environment() -> None:
    """LMCache's usage telemetry off, its log at errors only (unless the caller set a level)."""
    os.environ["LMCACHE_TRACK_USAGE"] = "false"
    os.environ["DO_NOT_TRACK"] = "1"
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")


def lmcache_version() -> str:
    """The installed LMCache's version; PeerUnavailable when it cannot be imported."""
    _quiet_environment()
    try:
        from importlib.metadata import version

        import lmcache.v1.cache_engine  # noqa: F401 - what the bench needs must import
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PeerUnavailable(f"LMCache is not available ({reason}); {INSTALL}") from None
    return version("lmcache")


def _connector_class():
    """The bench's CPU connector, a subclass of LMCache's ``GPUConnectorInterface`` (made on
    first use: LMCache is imported only when it is measured)."""
    import torch
    from lmcache.v1.gpu_connector import GPUConnectorInterface

    class CPUKVConnector(GPUConnectorInterface):
        """Copies chunk bytes between the prompt's KV (``kv=``, a uint8 numpy buffer of whole
        chunks back to back) and LMCache's memory objects."""

        def __init__(self, geometry: Geometry):
            self.geometry = geometry
            self.kvcaches = None

        def _span(self, kv: np.ndarray, start: int, end: int) -> np.ndarray:
            size = self.geometry.bytes_per_token
            return kv[start * size : end * size]

        def from_gpu(self, memory_obj, start: int, end: int, **kwargs) -> None:
            dst = np.frombuffer(memory_obj.byte_array, dtype=np.uint8)
            np.copyto(dst, self._span(kwargs["kv"], start, end))

        def to_gpu(self, memory_obj, start: int, end: int, **kwargs) -> None:
            span = self._span(kwargs["kv"], start, end)
            src = np.frombuffer(memory_obj.byte_array, dtype=np.uint8)
            np.copyto(span, src[: span.nbytes])

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs) -> None:
            for obj, start, end in zip(memory_objs, starts, ends, strict=True):
                self.from_gpu(obj, start, end, **kwargs)

        def batched_to_gpu(self, memory_objs=None, starts=None, ends=None, **kwargs) -> None:
            for obj, start, end in zip(memory_objs or [], starts or [], ends or [], strict=True):
                self.to_gpu(obj, start, end, **kwargs)

        def get_shape(self, num_tokens: int) -> torch.Size:
            geo = self.geometry
            return torch.Size([2, geo.layers, num_tokens, geo.kv_heads * geo.head_dim])

    return CPUKVConnector


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


class LMCacheSystem(System):
    """One LMCache engine with one backend: ``local_cpu``, ``local_disk`` (in ``directory``) or
    ``redis`` (at ``redis_url``). ``staging_bytes`` sizes its CPU memory (the hot cache itself
    for ``local_cpu``)."""

    side = PEER

    def __init__(
        self,
        backend: str,
        geometry: Geometry,
        staging_bytes: int,
        directory: Path | None = None,
        disk_bytes: int = 0,
        redis_url: str | None = None,
    ):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown LMCache backend {backend!r}")
        self.backend = backend
        self.geometry = geometry
        self.directory = directory
        self.redis_url = redis_url
        self.tier_class = {"local_cpu": HOST_MEMORY, "local_disk": LOCAL_DISK, "redis": REDIS}[
            backend
        ]
        self.name = f"LMCache {backend}"
        self.page_cache = backend == "local_disk"
        version = lmcache_version()
        try:
            self._open(staging_bytes, disk_bytes)
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PeerUnavailable(f"{self.name} did not start: {reason}") from None
        where = {"local_disk": f" in {directory}", "redis": f" at {redis_url}"}.get(backend, "")
        self.detail = f"LMCache {version} {backend}{where}, chunk_size={geometry.chunk_tokens}"
        self._redis = None
        if backend == "redis":
            import redis

            self._redis = redis.Redis.from_url(str(redis_url))

    def _open(self, staging_bytes: int, disk_bytes: int) -> None:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata

        geo = self.geometry
        options: dict = {
            "chunk_size": geo.chunk_tokens,
            "local_cpu": self.backend == "local_cpu",
            "max_local_cpu_size": staging_bytes / GiB,
        }
        if self.backend == "local_disk":
            assert self.directory is not None
            self.directory.mkdir(parents=True, exist_ok=True)
            options |= {
                "local_disk": f"file://{self.directory}",
                "max_local_disk_size": disk_bytes / GiB,
            }
        elif self.backend == "redis":
            # LMCache names a server without a database: its remote_url is host and port
            options["remote_url"] = str(self.redis_url).rsplit("/", 1)[0]
        config = LMCacheEngineConfig.from_defaults(**options)
        metadata = LMCacheMetadata(
            model_name=f"kvtier-bench-{geo.model}",
            world_size=1,
            local_world_size=1,
            worker_id=0,
            local_worker_id=0,
            kv_dtype=_torch_dtype(geo.dtype),
            kv_shape=(geo.layers, 2, geo.chunk_tokens, geo.kv_heads, geo.head_dim),
            chunk_size=geo.chunk_tokens,
        )
        self.instance = f"kvtier-bench-{self.backend}-{uuid.uuid4().hex[:8]}"
        connector = _connector_class()(geo)
        self.engine = LMCacheEngineBuilder.get_or_create(
            self.instance, config, metadata, connector, None, None
        )
        self.engine.post_init()

    def store(self, prompt: Prompt) -> None:
        self.engine.store(prompt.torch_tokens, kv=prompt.kv)

    def seen(self, prompt: Prompt) -> int:
        return int(self.engine.lookup(prompt.torch_tokens))

    def retrieve(self, prompt: Prompt, out: np.ndarray) -> int:
        return int(self.engine.retrieve(prompt.torch_tokens, kv=out).sum())

    def forget(self, prompts: Sequence[Prompt]) -> None:
        if self._redis is not None:
            # LMCache 0.5.6's Redis connector has no removal (``remove_sync`` raises
            # NotImplementedError); the server holds this engine's objects alone
            self._redis.flushdb()
            return
        for prompt in prompts:
            self.engine.clear(prompt.torch_tokens)
        if self.backend == "local_disk":
            _resync_disk_books(self.engine)

    def held_bytes(self) -> int | None:
        if self.backend == "local_cpu":
            backend = self.engine.storage_manager.storage_backends["LocalCPUBackend"]
            with backend.cpu_lock:
                return sum(obj.get_physical_size() for obj in backend.hot_cache.values())
        if self.backend == "local_disk":
            assert self.directory is not None
            return sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())
        return redis_value_bytes(self._redis) if self._redis is not None else None

    def drop_page_cache(self) -> None:
        if self.directory is not None:
            drop_page_cache(self.directory)

    def close(self) -> None:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder

        if self.backend == "redis":
            _close_remote(self.engine)
        LMCacheEngineBuilder.destroy(self.instance)
        if self._redis is not None:
            self._redis.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def _resync_disk_books(engine) -> None:
    """Set the local disk backend's count of bytes held to what it holds. LMCache 0.5.6's
    ``LocalDiskBackend.remove`` deletes the file and its entry but not its size from
    ``current_cache_size``, so after removals new puts find the disk full (and nothing left to
    evict) and are dropped."""
    backend = engine.storage_manager.storage_backends.get("LocalDiskBackend")
    if backend is None:
        return
    with backend.disk_lock:
        backend.current_cache_size = sum(meta.size for meta in backend.dict.values())


def _close_remote(engine) -> None:
    """Close the Redis connection of an engine's remote backend the way its event loop
    allows. LMCache 0.5.6's ``RedisConnector.close`` awaits a synchronous executor shutdown
    that waits for a coroutine on that same loop, so closing the engine hangs for good; here
    the executor's own async shutdown runs instead, the connection is closed, and the
    backend's close is skipped."""
    import asyncio

    manager = engine.storage_manager
    remote = manager.storage_backends.get("RemoteBackend") if manager is not None else None
    if remote is None or remote.connection is None:
        return
    wrapped = remote.connection
    inner = wrapped.getWrappedConnector() if hasattr(wrapped, "getWrappedConnector") else wrapped

    async def shut() -> None:
        await inner.pq_executor.shutdown_async(wait=True)
        await inner.connection.close()

    try:
        asyncio.run_coroutine_threadsafe(shut(), manager.loop).result(timeout=10)
    finally:
        remote.close = lambda: None


__all__ = ["BACKENDS", "INSTALL", "LMCacheSystem", "PeerUnavailable", "lmcache_version"]
