"""How kvtier's vLLM connector is configured: ``kv_connector_extra_config`` or a JSON file.

vLLM hands the connector a free-form dict (``--kv-transfer-config '{"kv_connector":
"KVTierConnector", "kv_connector_module_path": "kvtier.engines.vllm.connector",
"kv_connector_extra_config": {...}}'``). :class:`ConnectorConfig` is that dict typed and checked:
a bad key, URL, size or number is refused when the engine starts, with one line saying what to
give instead. ``{"config": "/path/kvtier.json"}`` reads the same keys from a file.

The connector's two halves run in two processes (vLLM's EngineCore runs the scheduler side, its
Worker the model), so every tier must be one both can open: ``slab://`` in ``/dev/shm`` is the
shared host-memory tier, ``slab://``/``file://`` on a disk the local-disk tiers. ``memory://``
lives inside one process and is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.policy.store_admission import ADMIT_MODES
from kvtier.specs.units import parse_size
from kvtier.tiers.base import TierURL
from kvtier.tiers.registry import check_tier_url

#: Schemes a single process keeps to itself: the two halves could not share them.
PRIVATE_SCHEMES = ("memory",)
WRITE_MODES = ("through", "back")


@dataclass(frozen=True)
class ConnectorConfig:
    """The connector's settings (the keys of ``kv_connector_extra_config``).

    ``tiers``: tier URLs fast→slow (the first should be the host-memory tier, e.g.
    ``slab:///dev/shm/kvtier?size=4GiB``). ``chunk_tokens``: tokens per kvtier block, a multiple of
    vLLM's block size. ``write``: ``through`` stores new chunks in every tier, ``back`` only in the
    first (slower tiers get what it spills). ``preload``: from the moment a request is queued,
    move its KV from slower tiers into the first one, within ``preload_bytes`` in flight;
    ``preload_wait_s`` is how long a queued request whose KV is still moving up is held back
    (vLLM schedules others meanwhile). ``store``: keep new chunks (off: read-only use).
    ``load``: load what the tiers hold (off: write-only use). vLLM's ``kv_role`` sets both for a
    disaggregated fleet (:meth:`for_role`): a ``kv_producer`` (prefill engine) stores every chunk
    it computes and never loads, a ``kv_consumer`` (decode engine) loads and never stores, and
    waits up to ``producer_wait_s`` for the chunks its producer said it stored (the producer's
    response carries their count in ``kv_transfer_params``) to become visible in the tiers.
    ``admit``: which new chunks are stored: ``always``; ``repeat``, only a chunk some earlier
    request's prompt also held (one-shot prompts cost nothing and displace nothing); ``auto``,
    every chunk while recent prompts repeat chunks of earlier ones, else as ``repeat``.
    ``sync_host``: a request whose chunks all sit in the first tier (host memory; with one disk
    tier alone, that disk) loads inside the step that schedules it, before the forward, instead
    of waiting a step for an asynchronous load. ``records``: a JSON-lines file with one line per
    request the connector looked up. ``lookup_ttl_s``: how long a waiting request's lookup is
    reused when vLLM examines it again and nothing this engine did since could change it (other
    engines' stores to a shared tier are seen after at most this long; 0: look up every time).
    ``model_id``/``fingerprint`` override the namespace's model identity (default: the model
    folder's name and a hash of its weight files). ``tenant`` salts the namespace.
    ``layerwise``: a load the step waits for is read, then placed layer by layer beside the
    forward, which waits in each attention layer for that layer alone, and the step's new chunks
    are copied out layer by layer as the forward finishes each (off: the whole load before the
    forward starts, the saves before the step ends); unset, on where the KV is in GPU memory
    (copies run on the copy engines beside the forward) and off on the CPU backend (a copy
    beside the forward takes cores from it: :meth:`resolved`). ``staging_bytes``: on CUDA,
    the pinned host ring that chunks pass through between the tiers and GPU memory (at least
    one chunk; a larger load goes through it in rounds).
    """

    tiers: tuple[str, ...] = ()
    chunk_tokens: int = 256
    write: str = "through"
    preload: bool = True
    preload_bytes: int = 256 << 20
    preload_wait_s: float = 2.0
    lookup_ttl_s: float = 1.0
    store: bool = True
    load: bool = True
    producer_wait_s: float = 5.0
    admit: str = "auto"
    records: str | None = None
    model_id: str | None = None
    fingerprint: str | None = None
    tenant: str = ""
    queue_chunks: int = 256
    load_workers: int = 1
    sync_host: bool = True
    staging_bytes: int = 256 << 20
    layerwise: bool | None = None

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError(
                "kvtier's vLLM connector needs tiers, e.g. "
                '"tiers": ["slab:///dev/shm/kvtier?size=4GiB", "slab:///nvme/kv?size=200GiB"]'
            )
        for url in self.tiers:
            scheme = TierURL.parse(url).scheme
            if scheme in PRIVATE_SCHEMES:
                raise ConfigError(
                    f"{url}: a {scheme}:// tier lives in one process, and vLLM runs the "
                    "connector's halves in two; use slab:///dev/shm/<dir>?size=... for host memory"
                )
            check_tier_url(url)
        if self.chunk_tokens < 1:
            raise ConfigError(f"chunk_tokens must be at least 1, got {self.chunk_tokens}")
        if self.write not in WRITE_MODES:
            raise ConfigError(f"write must be one of {WRITE_MODES}, got {self.write!r}")
        if self.admit not in ADMIT_MODES:
            raise ConfigError(f"admit must be one of {ADMIT_MODES}, got {self.admit!r}")
        if min(self.preload_bytes, self.preload_wait_s, self.lookup_ttl_s) < 0:
            raise ConfigError("preload_bytes, preload_wait_s and lookup_ttl_s cannot be negative")
        if self.producer_wait_s < 0:
            raise ConfigError("producer_wait_s cannot be negative")
        if self.staging_bytes < 1:
            raise ConfigError(f"staging_bytes must be positive, got {self.staging_bytes}")
        if self.queue_chunks < 1 or self.load_workers < 1:
            raise ConfigError("queue_chunks and load_workers must be at least 1")
        if self.records is not None:
            parent = Path(self.records).expanduser().parent
            if not parent.is_dir():
                raise ConfigError(f"records: {parent} is not a directory")

    def resolved(self, on_gpu: bool) -> ConnectorConfig:
        """The config with ``layerwise`` decided: as given, or else on for KV in GPU memory."""
        from dataclasses import replace

        return self if self.layerwise is not None else replace(self, layerwise=on_gpu)

    def for_role(self, kv_role: str | None) -> ConnectorConfig:
        """The config as vLLM's ``kv_role`` narrows it: a producer stores every chunk and never
        loads, a consumer never stores; ``kv_both`` (or none) leaves it as configured."""
        from dataclasses import replace

        if kv_role in (None, "kv_both"):
            return self
        if kv_role == "kv_producer":
            return replace(self, load=False, admit="always", preload=False)
        if kv_role == "kv_consumer":
            return replace(self, store=False)
        raise ConfigError(
            f"kv_role {kv_role!r}: kvtier's connector takes kv_both, kv_producer or kv_consumer"
        )

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> ConnectorConfig:
        """The config in vLLM's ``kv_connector_extra_config`` (``config``: a JSON file of it)."""
        raw = dict(extra or {})
        path = raw.pop("config", None)
        if path is not None:
            try:
                loaded = json.loads(Path(path).expanduser().read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot read kvtier connector config {path}: {exc}") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{path}: a kvtier connector config is a JSON object")
            raw = {**loaded, **raw}
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown kvtier connector option(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for name, value in raw.items():
            values[name] = _coerce(name, value)
        return cls(**values)


def _coerce(name: str, value: Any) -> Any:
    """One option's value in its field's type, or a ConfigError naming the option."""
    try:
        if name == "tiers":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError("a list of tier URLs")
            return tuple(value)
        if name in ("preload_bytes", "staging_bytes"):
            return parse_size(value) if isinstance(value, str) else int(value)
        if name in ("chunk_tokens", "queue_chunks", "load_workers"):
            if isinstance(value, bool) or int(value) != value:
                raise ValueError("an integer")
            return int(value)
        if name in ("preload_wait_s", "lookup_ttl_s", "producer_wait_s"):
            return float(value)
        if name == "layerwise" and value is None:
            return None
        if name in ("preload", "store", "load", "sync_host", "layerwise"):
            if not isinstance(value, bool):
                raise ValueError("true or false")
            return value
        if value is not None and not isinstance(value, str):
            raise ValueError("a string")
        return value
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"kvtier connector option {name}={value!r}: expected {exc}") from None


__all__ = ["PRIVATE_SCHEMES", "ConnectorConfig"]
