"""A load's layers as they land, so that a forward waits for one layer and not the whole load."""

from __future__ import annotations

import threading
from typing import Any


class LoadProgress:
    """Per-layer completion of one load into an engine's paged KV.

    The thread that moves the bytes marks each layer once its pages are written (on CUDA: once
    the copies are queued, with the event that completes them); :meth:`wait_layer` returns
    when layer ``i`` is usable. On CUDA it makes the compute stream wait for the layer's event,
    so the host never blocks on the GPU and the forward's earlier layers run meanwhile. A load
    that stops early (a chunk missing or corrupt) still marks every layer: the blocks it did not
    fill are reported as load errors and recomputed, so no waiter hangs.
    """

    def __init__(self, layers: int):
        self._ready = [threading.Event() for _ in range(layers)]
        self._events: list[Any] = [None] * layers

    @property
    def layers(self) -> int:
        """Layers the load covers."""
        return len(self._ready)

    def mark(self, layer: int, event: Any = None) -> None:
        """Layer ``layer`` is written (or, with a CUDA ``event``, queued to be by it)."""
        self._events[layer] = event
        self._ready[layer].set()

    def finish(self) -> None:
        """Every layer not yet marked is as done as it will get (the load ended)."""
        for ready in self._ready:
            ready.set()

    def layer_ready(self, layer: int) -> bool:
        """Whether layer ``layer`` has been marked."""
        return self._ready[layer].is_set()

    def wait_layer(self, layer: int, timeout: float | None = None) -> bool:
        """Wait until layer ``layer`` is usable by the compute stream; False on timeout."""
        if not self._ready[layer].wait(timeout):
            return False
        event = self._events[layer]
        if event is not None:
            import torch

            torch.cuda.current_stream().wait_event(event)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every layer (see :meth:`wait_layer`)."""
        return all(self.wait_layer(i, timeout) for i in range(self.layers))


__all__ = ["LoadProgress"]
