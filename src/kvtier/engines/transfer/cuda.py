"""The transfer engine for KV in CUDA memory: a pinned staging ring and one copy stream each way.

Saves: on the device-to-host stream, which first waits (on the GPU, not the host) for the
work already queued on the compute stream, each layer's blocks of a batch of chunks are
gathered by one ``index_select`` launch into a device scratch laid out as the host chunks are,
then copied to the pinned ring in one DMA copy per chunk. Loads: on the host-to-device stream,
the ring's chunks are copied to a device scratch (whole chunks, or layer by layer when the
forward waits per layer) and each layer is scattered into its blocks by one ``index_copy_``
launch; an event per layer lets :class:`~kvtier.engines.transfer.progress.LoadProgress` make
the compute stream wait for exactly that layer. The host only ever waits for these streams'
events, never for the compute stream. A load larger than the ring goes through it in rounds.
Chunks already in device memory (read there straight from a file, GPUDirect Storage) skip the
ring: they are stacked into the scratch on the same stream and scattered the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvtier.engines.transfer.engine import NULL_BLOCK, Placement, check_placement
from kvtier.engines.transfer.host import storage_bytes
from kvtier.engines.transfer.pages import PagedKV
from kvtier.engines.transfer.progress import LoadProgress
from kvtier.errors import ConfigError
from kvtier.tiers.io.buffers import PAGE, address, align_up


def require_cuda(device: str) -> torch.device:
    """``device`` as a torch device, or a ConfigError saying in one line why it is not here."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ConfigError(f"{device} is not a CUDA device")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{device} asked for, but this torch ({torch.__version__}) sees no CUDA device"
        )
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ConfigError(f"{device} asked for, but only {torch.cuda.device_count()} GPU(s) here")
    return torch.device("cuda", index)


class StagingRing:
    """``slots`` pinned host buffers of ``slot_bytes`` each, lent out and given back
    (thread-safe; a taker waits while every slot is out)."""

    def __init__(self, ring_bytes: int, slot_bytes: int):
        stride = align_up(slot_bytes, PAGE)
        slots = ring_bytes // stride
        if slots < 1:
            raise ConfigError(
                f"a staging ring of {ring_bytes} bytes holds no chunk of {slot_bytes} bytes: "
                "give at least one chunk's worth"
            )
        self.slot_bytes = slot_bytes
        self.memory = torch.empty(slots * stride, dtype=torch.uint8, pin_memory=True)
        host = self.memory.numpy()
        self.arrays = [host[i * stride : i * stride + slot_bytes] for i in range(slots)]
        self.tensors = [self.memory[i * stride : i * stride + slot_bytes] for i in range(slots)]
        self._slot_at = {address(a): i for i, a in enumerate(self.arrays)}
        self._free = list(range(slots))
        self._cond = threading.Condition()

    @property
    def slots(self) -> int:
        """Buffers in the ring."""
        return len(self.arrays)

    def slot_of(self, buf: Any) -> int | None:
        """The slot ``buf`` is, if it is one of the ring's buffers."""
        return self._slot_at.get(address(buf))

    def take(self, n: int) -> list[int]:
        """Between one and ``n`` free slots (waits for one to be free)."""
        with self._cond:
            self._cond.wait_for(lambda: self._free)
            got, self._free = self._free[: max(1, n)], self._free[max(1, n) :]
            return got

    def give(self, slots: Sequence[int]) -> None:
        """Return slots."""
        with self._cond:
            self._free.extend(slots)
            self._cond.notify_all()


class CudaTransfer:
    """Blocks between CUDA tensors' pages and pinned host chunks (see the module docstring)."""

    def __init__(
        self, kv: PagedKV, caches: Sequence[torch.Tensor], chunk_tokens: int, ring_bytes: int
    ):
        self.device = require_cuda(kv.device)
        self.kv = kv
        self.blocks_per_chunk = kv.blocks_per_chunk(chunk_tokens)
        self._caches = list(caches)
        self._views = [
            storage_bytes(c).as_strided(p.view_shape, p.view_strides, p.offset)
            for c, p in zip(caches, kv.layers, strict=True)
        ]
        self.ring = StagingRing(ring_bytes, self.chunk_bytes)
        self._d2h = torch.cuda.Stream(self.device)
        self._h2d = torch.cuda.Stream(self.device)
        self._spans = [kv.layer_span(i, self.blocks_per_chunk) for i in range(kv.num_layers)]

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one host chunk."""
        return self.kv.chunk_bytes(self.blocks_per_chunk)

    def take_buffers(self, n: int) -> list[np.ndarray]:
        """Between one and ``n`` pinned ring buffers (waits while the ring is all lent)."""
        return [self.ring.arrays[i] for i in self.ring.take(n)]

    def give_buffers(self, bufs: Sequence[np.ndarray]) -> None:
        """Return ring buffers."""
        self.ring.give([s for s in (self.ring.slot_of(b) for b in bufs) if s is not None])

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return (
            torch.tensor(list(ids), dtype=torch.int64)
            .pin_memory()
            .to(self.device, non_blocking=True)
        )

    def _rows(self, scratch: torch.Tensor, layer: int) -> torch.Tensor:
        """Layer ``layer`` of a device scratch of chunks, ``[chunks, blocks, *grid, fragment]``."""
        start, end = self._spans[layer]
        shape = self.kv.layers[layer].view_shape[1:]
        return scratch[:, start:end].unflatten(1, (self.blocks_per_chunk, *shape))

    def _pairs(self, batch: Sequence[Placement], layer: int, skip_null: bool):
        """Blocks of ``layer`` and where they sit in a scratch of the batch's chunks: the
        engine's block ids, the chunk index and the block index in the chunk."""
        blocks, chunk, row = [], [], []
        for c, place in enumerate(batch):
            for j, block in enumerate(place.ids_by_layer[layer], start=place.skip):
                if not (skip_null and block == NULL_BLOCK):
                    blocks.append(block)
                    chunk.append(c)
                    row.append(j)
        return blocks, chunk, row

    def _slots_for(self, bufs: Sequence[Any], want: int) -> tuple[list[int], bool]:
        """The ring slots ``bufs`` already are (all of them), or freshly taken ones."""
        own = [self.ring.slot_of(b) for b in bufs]
        if own and all(s is not None for s in own):
            return [s for s in own if s is not None], False
        return self.ring.take(want), True

    def to_host(
        self,
        places: Sequence[Placement],
        outs: Sequence[Any],
        layers: Sequence[int] | None = None,
        after: Any = None,
    ) -> None:
        """Gather blocks (every layer, or ``layers``) into ``outs`` through the ring; returns
        once the bytes are there. The copies wait (on the GPU) for ``after`` (an event), or
        else for the work queued on the caller's stream."""
        for place in places:
            check_placement(self.kv, self.blocks_per_chunk, place)
        which = list(range(self.kv.num_layers)) if layers is None else list(layers)
        spans = [(0, self.chunk_bytes)] if layers is None else [self._spans[i] for i in which]
        caller = torch.cuda.current_stream(self.device)
        done = 0
        while done < len(places):
            slots, lent = self._slots_for(outs[done:], len(places) - done)
            batch = places[done : done + len(slots)]
            with torch.cuda.stream(self._d2h):
                if after is not None:  # the forward's writes first, on the GPU
                    self._d2h.wait_event(after)
                else:
                    self._d2h.wait_stream(caller)
                scratch = torch.empty(
                    (len(batch), self.chunk_bytes), dtype=torch.uint8, device=self.device
                )
                for layer in which:
                    blocks, chunk, row = self._pairs(batch, layer, skip_null=False)
                    got = self._views[layer].index_select(0, self._ids(blocks))
                    self._rows(scratch, layer)[self._ids(chunk), self._ids(row)] = got
                for c, slot in enumerate(slots[: len(batch)]):
                    for start, end in spans:
                        self.ring.tensors[slot][start:end].copy_(
                            scratch[c, start:end], non_blocking=True
                        )
                copied = torch.cuda.Event()
                copied.record(self._d2h)
            copied.synchronize()  # the copy stream only
            if lent:
                for c, slot in enumerate(slots[: len(batch)]):
                    out = np.frombuffer(memoryview(outs[done + c]).cast("B"), dtype=np.uint8)
                    for start, end in spans:
                        out[start:end] = self.ring.arrays[slot][start:end]
                self.ring.give(slots)
            done += len(batch)

    def to_device(
        self,
        places: Sequence[Placement],
        chunks: Sequence[Any],
        progress: LoadProgress | None = None,
        layerwise: bool = False,
        after: Any = None,
    ) -> None:
        """Copy chunks to the device and scatter them layer by layer, an event per layer.
        ``after``: a CUDA event the scatter waits for on the GPU (the compute stream's work
        on these blocks, e.g. vLLM zeroing them); returns once the host buffers are free.
        A chunk may also be a CUDA tensor already on this device (read there straight)."""
        for place in places:
            check_placement(self.kv, self.blocks_per_chunk, place)
        try:
            resident = [i for i, c in enumerate(chunks[: len(places)]) if _on_device(c)]
            if resident:
                places, chunks = self._place_resident(places, chunks, resident, progress, after)
            done = 0
            while done < len(places):
                slots, lent = self._slots_for(chunks[done:], len(places) - done)
                batch = places[done : done + len(slots)]
                if lent:
                    for c, slot in enumerate(slots[: len(batch)]):
                        src = np.frombuffer(memoryview(chunks[done + c]).cast("B"), np.uint8)
                        self.ring.arrays[slot][:] = src[: self.chunk_bytes]
                last = done + len(batch) == len(places)
                copied = self._load_batch(
                    batch, slots, progress if last else None, layerwise, after
                )
                copied.synchronize()  # the ring's slots are free once their bytes left
                if lent:
                    self.ring.give(slots)
                done += len(batch)
        finally:
            if progress is not None:
                progress.finish()

    def _load_batch(
        self,
        batch: Sequence[Placement],
        slots: Sequence[int],
        progress: LoadProgress | None,
        layerwise: bool,
        after: Any,
    ) -> torch.cuda.Event:
        """Queue one ring-full of chunks; the event after its host→device copies."""
        with torch.cuda.stream(self._h2d):
            if after is not None:
                self._h2d.wait_event(after)
            scratch = torch.empty(
                (len(batch), self.chunk_bytes), dtype=torch.uint8, device=self.device
            )
            ring = [self.ring.tensors[s] for s in slots[: len(batch)]]
            if not layerwise:
                for c, host in enumerate(ring):
                    scratch[c].copy_(host, non_blocking=True)
            for layer in range(len(self._views)):
                if layerwise:
                    start, end = self._spans[layer]
                    for c, host in enumerate(ring):
                        scratch[c, start:end].copy_(host[start:end], non_blocking=True)
                self._scatter_layer(scratch, batch, layer, progress)
            copied = torch.cuda.Event()
            copied.record(self._h2d)
        return copied

    def _place_resident(
        self,
        places: Sequence[Placement],
        chunks: Sequence[Any],
        resident: list[int],
        progress: LoadProgress | None,
        after: Any,
    ) -> tuple[list[Placement], list[Any]]:
        """Scatter the chunks already in device memory; the places and chunks left."""
        taken = set(resident)
        rest = [i for i in range(len(places)) if i not in taken]
        copied = self._load_resident(
            [places[i] for i in resident],
            [chunks[i] for i in resident],
            progress if not rest else None,  # the last batch marks the layers
            after,
        )
        copied.synchronize()  # the resident chunks may be freed once this returns
        return [places[i] for i in rest], [chunks[i] for i in rest]

    def _load_resident(
        self,
        batch: Sequence[Placement],
        chunks: Sequence[torch.Tensor],
        progress: LoadProgress | None,
        after: Any,
    ) -> torch.cuda.Event:
        """Scatter chunks already in device memory; the event after their scatter."""
        caller = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._h2d):
            self._h2d.wait_stream(caller)  # whatever wrote the chunks on the caller's stream
            if after is not None:
                self._h2d.wait_event(after)
            flat = [c.reshape(-1).view(torch.uint8)[: self.chunk_bytes] for c in chunks]
            scratch = torch.stack(flat)
            for layer in range(len(self._views)):
                self._scatter_layer(scratch, batch, layer, progress)
            copied = torch.cuda.Event()
            copied.record(self._h2d)
        return copied

    def _scatter_layer(
        self,
        scratch: torch.Tensor,
        batch: Sequence[Placement],
        layer: int,
        progress: LoadProgress | None,
    ) -> None:
        """One layer of a device scratch of chunks into its blocks, by one ``index_copy_`` on
        the current stream; its event in ``progress``."""
        blocks, chunk, row = self._pairs(batch, layer, skip_null=True)
        if blocks:
            rows = self._rows(scratch, layer)
            ids = self._ids(blocks)
            self._views[layer].index_copy_(0, ids, rows[self._ids(chunk), self._ids(row)])
        if progress is not None:
            landed = torch.cuda.Event()
            landed.record(torch.cuda.current_stream(self.device))
            progress.mark(layer, landed)

    def close(self) -> None:
        """Wait for queued copies and drop the streams' work."""
        self._d2h.synchronize()
        self._h2d.synchronize()
        self._views = []


def _on_device(chunk: Any) -> bool:
    """Whether a chunk is a CUDA tensor (not a host buffer)."""
    return isinstance(chunk, torch.Tensor) and chunk.device.type == "cuda"


__all__ = ["CudaTransfer", "StagingRing", "require_cuda"]
