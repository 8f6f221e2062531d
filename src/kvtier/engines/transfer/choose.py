"""The transfer engine for an engine's caches, chosen by the device they live on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtier.engines.transfer.engine import DEFAULT_RING_BYTES, TransferEngine
from kvtier.engines.transfer.pages import PagedKV
from kvtier.errors import ConfigError


def open_transfer_engine(
    caches: Sequence[Any],
    block_size: int,
    chunk_tokens: int,
    ring_bytes: int = DEFAULT_RING_BYTES,
    keep_buffers: int = 64,
) -> TransferEngine:
    """The transfer engine for ``caches`` (one tensor view per layer, blocks first): host
    copies for CPU tensors, streams and a pinned ``ring_bytes`` staging ring for CUDA ones."""
    kv = PagedKV.of(caches, block_size)
    if kv.device == "cpu":
        from kvtier.engines.transfer.host import HostTransfer

        return HostTransfer(kv, caches, chunk_tokens, keep_buffers)
    if kv.device.startswith("cuda"):
        from kvtier.engines.transfer.cuda import CudaTransfer

        return CudaTransfer(kv, caches, chunk_tokens, ring_bytes)
    raise ConfigError(f"kvtier moves KV on CPU and CUDA devices, not {kv.device}")


__all__ = ["open_transfer_engine"]
