"""Adapters to real inference engines: HF transformers (`hf`) and vLLM's KV connector (`vllm`).

Importing this package is cheap; torch and transformers load with the first name used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "HFEngine": "kvtier.engines.hf",
    "GenerationResult": "kvtier.engines.hf",
    "PrefillResult": "kvtier.engines.hf",
    "RequestRecord": "kvtier.engines.hf",
    "ReuseQuery": "kvtier.engines.hf",
    "ReuseDecision": "kvtier.engines.hf",
    "load_all": "kvtier.engines.hf",
    "recompute_all": "kvtier.engines.hf",
    "from_policy": "kvtier.engines.hf",
    "model_namespace": "kvtier.engines.hf",
    "KVLayout": "kvtier.engines.kv_layout",
    "LoadedModel": "kvtier.engines.embedded",
    "load_model": "kvtier.engines.embedded",
    "fingerprint_files": "kvtier.engines.embedded",
    "fingerprint_state_dict": "kvtier.engines.embedded",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtier.engines' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
