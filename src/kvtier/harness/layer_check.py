"""kvtier's connector with a check inside the forward: each attention layer's wait for its KV
is followed by a comparison of that layer's loaded blocks with the bytes read for them.

The tests run it inside real vLLM engines (``kv_connector_module_path`` =
``kvtier.harness.layer_check``, ``kv_connector`` = ``LayerCheckedConnector``) to show that a
layer-by-layer load never lets an attention layer run before its own blocks hold the stored
bytes. One JSON line per checked layer goes to the file named by ``KVTIER_LAYER_CHECK``; the
engine's output is not touched.
"""

from __future__ import annotations

import json
import os
import threading

from kvtier.engines.transfer.engine import NULL_BLOCK, chunk_layers
from kvtier.engines.vllm.connector import KVTierConnector

#: The environment variable naming the JSON-lines file the checks go to.
CHECK_FILE = "KVTIER_LAYER_CHECK"


class LayerCheckedConnector(KVTierConnector):
    """:class:`KVTierConnector` whose ``wait_for_layer_load`` checks the layer it waited for."""

    _lock = threading.Lock()

    def wait_for_layer_load(self, layer_name: str) -> None:
        super().wait_for_layer_load(layer_name)
        worker = self._worker
        path = os.environ.get(CHECK_FILE)
        step = worker._step_load if worker is not None else None
        if worker is None or step is None or path is None or worker.engine is None:
            return
        layer = worker._layer_of[layer_name]
        ready = step.progress.layer_ready(layer)
        engine = worker.engine
        view = engine._views[layer]  # the host engine's numpy view of this layer's pages
        blocks = ok = 0
        for place, buf in zip(step.places, step.bufs, strict=False):
            rows = chunk_layers(engine.kv, engine.blocks_per_chunk, buf)[layer]
            for j, block in enumerate(place.ids_by_layer[layer], start=place.skip):
                if block != NULL_BLOCK:
                    blocks += 1
                    ok += bool((view[block] == rows[j]).all())
        line = {"layer": layer, "ready": ready, "blocks": blocks, "matching": ok}
        with self._lock, open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


__all__ = ["CHECK_FILE", "LayerCheckedConnector"]
