"""The transfer engine for KV in host memory (vLLM's CPU backend): one memcpy per page fragment.

Each layer's pages are a strided numpy view of its tensor's storage (no copy); a block moves
as one slice assignment, which numpy runs as plain memcpy of its fragments. torch's
``index_copy_`` and ``index_select`` take a slow element-wise path for these shapes, and
numpy's ``take`` copies a non-contiguous source whole first, so blocks are copied one by one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvtier.engines.transfer.engine import NULL_BLOCK, Placement, check_placement, chunk_layers
from kvtier.engines.transfer.pages import LayerPages, PagedKV
from kvtier.engines.transfer.progress import LoadProgress
from kvtier.errors import ConfigError
from kvtier.tiers.io.buffers import BufferPool, address


def storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``tensor`` as a flat uint8 tensor (no copy)."""
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(
        storage, 0, (storage.nbytes(),), (1,)
    )


def numpy_pages(tensor: torch.Tensor, pages: LayerPages) -> np.ndarray:
    """A layer's pages as a writable numpy view ``[blocks, *grid counts, fragment]``."""
    base = storage_bytes(tensor).numpy()
    if pages.offset + pages.extent > base.size:
        raise ConfigError("a KV cache layer's pages run past the end of its storage")
    return np.lib.stride_tricks.as_strided(
        base[pages.offset :], pages.view_shape, pages.view_strides, writeable=True
    )


class HostTransfer:
    """Blocks between CPU tensors' pages and host chunks (see the module docstring)."""

    def __init__(
        self, kv: PagedKV, caches: Sequence[torch.Tensor], chunk_tokens: int, keep: int = 64
    ):
        self.kv = kv
        self.blocks_per_chunk = kv.blocks_per_chunk(chunk_tokens)
        self._caches = list(caches)  # keeps the storage the views point into alive
        self._views = [numpy_pages(c, p) for c, p in zip(caches, kv.layers, strict=True)]
        self._pool = BufferPool(keep=keep)
        self._lent: dict[int, np.ndarray] = {}  # a lent slice's address → the pool's buffer
        self._lock = threading.Lock()

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one host chunk."""
        return self.kv.chunk_bytes(self.blocks_per_chunk)

    def take_buffers(self, n: int) -> list[np.ndarray]:
        """``n`` page-aligned, pre-faulted chunk buffers (kept for reuse when given back)."""
        size = self.chunk_bytes
        whole = [self._pool.take(size) for _ in range(max(1, n))]
        with self._lock:
            for buf in whole:
                self._lent[address(buf)] = buf
        return [buf[:size] for buf in whole]

    def give_buffers(self, bufs: Sequence[np.ndarray]) -> None:
        """Return buffers to the pool."""
        for buf in bufs:
            with self._lock:
                whole = self._lent.pop(address(buf), None)
            if whole is not None:
                self._pool.give(whole)

    def to_host(
        self,
        places: Sequence[Placement],
        outs: Sequence[Any],
        layers: Sequence[int] | None = None,
        after: Any = None,
    ) -> None:
        """Copy each placement's blocks (of every layer, or of ``layers``) into its chunk
        buffer."""
        which = range(self.kv.num_layers) if layers is None else layers
        for place, out in zip(places, outs, strict=True):
            check_placement(self.kv, self.blocks_per_chunk, place)
            rows_of = chunk_layers(self.kv, self.blocks_per_chunk, out)
            if not rows_of[0].flags.writeable:
                raise ConfigError("the chunk buffer to gather into is read-only")
            for layer in which:
                view, rows = self._views[layer], rows_of[layer]
                for j, block in enumerate(place.ids_by_layer[layer], start=place.skip):
                    rows[j] = view[block]

    def to_device(
        self,
        places: Sequence[Placement],
        chunks: Sequence[Any],
        progress: LoadProgress | None = None,
        layerwise: bool = False,
        after: Any = None,
    ) -> None:
        """Copy chunks into their blocks, layer by layer across every chunk, marking each
        layer in ``progress``; the null block is never written."""
        for place in places:
            check_placement(self.kv, self.blocks_per_chunk, place)
        split = [chunk_layers(self.kv, self.blocks_per_chunk, c) for c in chunks[: len(places)]]
        try:
            if progress is None:  # chunk by chunk: each chunk's bytes are read in order
                for place, layers in zip(places, split, strict=True):
                    for layer, view in enumerate(self._views):
                        self._place(view, layers[layer], place, layer)
                return
            for layer, view in enumerate(self._views):
                for place, layers in zip(places, split, strict=True):
                    self._place(view, layers[layer], place, layer)
                progress.mark(layer)
        finally:
            if progress is not None:
                progress.finish()

    @staticmethod
    def _place(view: np.ndarray, rows: np.ndarray, place: Placement, layer: int) -> None:
        for j, block in enumerate(place.ids_by_layer[layer], start=place.skip):
            if block != NULL_BLOCK:
                view[block] = rows[j]

    def close(self) -> None:
        """Nothing to release beyond memory the garbage collector takes."""
        self._views = []


__all__ = ["HostTransfer", "numpy_pages", "storage_bytes"]
