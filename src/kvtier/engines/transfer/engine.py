"""The transfer engine's contract: whole blocks between an engine's paged KV and host chunks.

A chunk on the host is ``blocks_per_chunk`` blocks of every layer, layer-major (see
:mod:`~kvtier.engines.transfer.pages`). :meth:`TransferEngine.to_host` gathers blocks into
chunks; :meth:`TransferEngine.to_device` scatters chunks (or the tail of one: ``skip``) into
blocks, layer after layer, marking each layer in a
:class:`~kvtier.engines.transfer.progress.LoadProgress` as it lands. Host buffers for either
direction come from the engine (:meth:`TransferEngine.take_buffers`): on CUDA they are its pinned
staging ring, so a tier reads straight into memory the copy engine can take.
:func:`~kvtier.engines.transfer.choose.open_transfer_engine` picks the implementation by
the caches' device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kvtier.engines.transfer.pages import PagedKV
from kvtier.engines.transfer.progress import LoadProgress
from kvtier.errors import ConfigError

#: vLLM's null block: a placeholder in a block table, never written by a load.
NULL_BLOCK = 0
#: The default pinned staging ring on CUDA.
DEFAULT_RING_BYTES = 256 << 20


@dataclass(frozen=True)
class Placement:
    """Where one chunk's blocks are in the engine: each layer's block ids (layers of different
    KV-cache groups use different block tables), and ``skip``, the chunk's first block they
    hold (a load may need only the tail of a chunk)."""

    ids_by_layer: tuple[tuple[int, ...], ...]
    skip: int = 0

    @classmethod
    def same(cls, ids: Sequence[int], layers: int, skip: int = 0) -> Placement:
        """Every layer in the same blocks ``ids``."""
        row = tuple(int(i) for i in ids)
        return cls((row,) * layers, skip)

    @property
    def count(self) -> int:
        """Blocks placed per layer."""
        return len(self.ids_by_layer[0]) if self.ids_by_layer else 0


class TransferEngine(Protocol):
    """Moves whole blocks between an engine's paged KV and host chunk buffers."""

    kv: PagedKV
    blocks_per_chunk: int

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one host chunk."""
        ...

    def take_buffers(self, n: int) -> list[np.ndarray]:
        """Up to ``n`` (at least one) host chunk buffers to read into or gather into."""
        ...

    def give_buffers(self, bufs: Sequence[np.ndarray]) -> None:
        """Return buffers :meth:`take_buffers` handed out."""
        ...

    def to_host(
        self,
        places: Sequence[Placement],
        outs: Sequence[Any],
        layers: Sequence[int] | None = None,
        after: Any = None,
    ) -> None:
        """Gather each chunk's blocks into ``outs``, every layer or only ``layers`` (a save
        layer by layer); returns once the bytes are there. ``after``: on CUDA, an event the
        copies wait for on the GPU (the compute stream's writes of those layers)."""
        ...

    def to_device(
        self,
        places: Sequence[Placement],
        chunks: Sequence[Any],
        progress: LoadProgress | None = None,
        layerwise: bool = False,
        after: Any = None,
    ) -> None:
        """Scatter ``chunks`` into the blocks ``places`` name, layer by layer, marking each in
        ``progress``; returns once the host buffers may be reused. ``layerwise``: on CUDA, copy
        host→device one layer at a time, so the first layer is usable sooner. ``after``: on
        CUDA, an event the scatter waits for on the GPU (the compute stream's work on the
        blocks)."""
        ...

    def close(self) -> None:
        """Release staging memory and streams."""
        ...


def check_placement(kv: PagedKV, blocks_per_chunk: int, place: Placement) -> None:
    """Refuse a placement that does not fit a chunk of ``blocks_per_chunk`` blocks."""
    if len(place.ids_by_layer) != kv.num_layers:
        raise ConfigError(
            f"a placement names {len(place.ids_by_layer)} layers, the engine has {kv.num_layers}"
        )
    n = place.count
    if place.skip < 0 or place.skip + n > blocks_per_chunk:
        raise ConfigError(
            f"blocks {place.skip}..{place.skip + n} are not in a chunk of {blocks_per_chunk}"
        )
    for ids in set(place.ids_by_layer):
        if len(ids) != n:
            raise ConfigError("a placement's layers name different numbers of blocks")
        if ids and (min(ids) < 0 or max(ids) >= kv.num_blocks):
            bad = next(b for b in ids if not 0 <= b < kv.num_blocks)
            raise ConfigError(f"block {bad} is not in the engine's {kv.num_blocks} blocks")


def chunk_layers(kv: PagedKV, blocks_per_chunk: int, buf: Any) -> list[np.ndarray]:
    """A host chunk ``buf`` as one ``[blocks, *grid counts, fragment]`` byte array per layer."""
    flat = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    need = kv.chunk_bytes(blocks_per_chunk)
    if flat.size < need:
        raise ConfigError(f"a chunk needs {need} bytes, the buffer has {flat.size}")
    out, start = [], 0
    for pages in kv.layers:
        end = start + blocks_per_chunk * pages.page_bytes
        out.append(flat[start:end].reshape(blocks_per_chunk, *pages.view_shape[1:]))
        start = end
    return out


__all__ = [
    "DEFAULT_RING_BYTES",
    "NULL_BLOCK",
    "Placement",
    "TransferEngine",
    "check_placement",
    "chunk_layers",
]
