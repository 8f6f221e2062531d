"""``KVTierConnector``: kvtier as a vLLM v1 KV connector (``kv_connector_module_path``).

    python -m vllm.entrypoints.openai.api_server --model <folder> --kv-transfer-config \\
      '{"kv_connector": "KVTierConnector",
        "kv_connector_module_path": "kvtier.engines.vllm.connector",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"tiers": ["slab:///dev/shm/kvtier?size=4GiB",
                                                 "slab:///nvme/kv?size=200GiB"]}}'

vLLM builds one instance per role: the scheduler's in its EngineCore process
(:class:`~kvtier.engines.vllm.scheduler.SchedulerSide`), the worker's in each Worker process
(:class:`~kvtier.engines.vllm.worker.WorkerSide`). They share no memory; they share the tiers
(see :mod:`kvtier.engines.vllm.open_tiers`) and talk through the per-step metadata and the
connector output vLLM carries between them. The installed vLLM is checked against the pinned
release range and connector interface before anything is opened.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from kvtier.engines.vllm.compat import check_vllm

check_vllm()

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
)

from kvtier.engines.vllm.config import ConnectorConfig  # noqa: E402
from kvtier.engines.vllm.groups import KVGroups, manager_block_views  # noqa: E402
from kvtier.engines.vllm.identity import (  # noqa: E402
    engine_geometry,
    engine_namespace,
    worker_rank,
)
from kvtier.engines.vllm.metadata import KVTierMetadata, KVTierWorkerMeta  # noqa: E402
from kvtier.engines.vllm.scheduler import SchedulerSide  # noqa: E402
from kvtier.engines.vllm.stats import KVTierPromMetrics, KVTierStats  # noqa: E402
from kvtier.engines.vllm.worker import WorkerSide  # noqa: E402

if TYPE_CHECKING:
    import torch


def _kv_on_gpu() -> bool:
    """Whether this vLLM keeps its KV cache in accelerator memory (any platform but CPU)."""
    from vllm.platforms import current_platform

    return not current_platform.is_cpu()


class KVTierConnector(KVConnectorBase_V1, SupportsHMA):
    """kvtier's tiered KV cache behind vLLM's KV-connector interface (with vLLM's hybrid
    KV-cache manager: full-attention and sliding-window groups; other kinds are refused)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        kv_role = getattr(self._kv_transfer_config, "kv_role", None)
        config = ConnectorConfig.from_extra(extra).for_role(kv_role)
        self.kvtier_config = config = config.resolved(on_gpu=_kv_on_gpu())
        geometry = engine_geometry(vllm_config, kv_cache_config)
        groups = KVGroups.of(kv_cache_config)
        namespace = engine_namespace(
            vllm_config, geometry, config.model_id, config.fingerprint, config.tenant
        )
        kv_events = getattr(vllm_config, "kv_events_config", None)
        events = bool(kv_events is not None and kv_events.enable_kv_cache_events)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(config, namespace, geometry, events)
        else:
            longest = int(getattr(vllm_config.model_config, "max_model_len", 0) or 0)
            rank = worker_rank(geometry)
            self._worker = WorkerSide(config, namespace, geometry, longest, rank, events, groups)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config) -> bool:
        """Sleep mode (vLLM 0.33) remaps the KV cache: the worker lets go of it and takes it
        back (:meth:`unregister_kv_caches`, :meth:`restore_kv_caches`)."""
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        """A dropped store is only a later miss: preempted requests need not wait for one."""
        return False

    # --- worker side -----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(manager_block_views(kv_caches, self._kv_cache_config))

    def unregister_kv_caches(self) -> None:
        if self._worker is not None:
            self._worker.unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        if self._worker is not None:
            self._worker.restore_kv_caches()

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, KVTierMetadata):
            self._worker.bind(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.unbind()

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        if self._worker is not None:
            self._worker.start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:  # the step's own loads, placed layer by layer
            self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        if self._worker is not None:  # this layer's blocks of the chunks the step completes
            self._worker.save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        if self._worker is not None:
            self._worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        sent = self._worker.get_finished_saving(finished_req_ids)
        return sent or None, self._worker.get_finished() or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_errors() if self._worker is not None else set()

    def handle_preemptions(self, kv_connector_metadata) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, KVTierMetadata):
            self._worker.handle_preemptions(kv_connector_metadata)

    def build_connector_worker_meta(self) -> KVTierWorkerMeta | None:
        return self._worker.take_report() if self._worker is not None else None

    def get_kv_connector_kv_cache_events(self):
        return self._worker.take_events() if self._worker is not None else None

    def take_events(self):
        return self._scheduler.take_events() if self._scheduler is not None else ()

    def get_kv_connector_stats(self) -> KVTierStats | None:
        side = self._worker or self._scheduler
        return side.take_stats() if side is not None else None

    def shutdown(self) -> None:
        for side in (self._worker, self._scheduler):
            if side is not None:
                with contextlib.suppress(Exception):
                    side.close()

    # --- scheduler side ----------------------------------------------------------------------
    def on_new_request(self, request) -> None:
        if self._scheduler is not None:
            self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVTierMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        if self._scheduler is not None:
            self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        if self._scheduler is None:
            return False, None
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    # --- class-level hooks ----------------------------------------------------------------------
    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Layer-by-layer loads wait inside the forward, which a CUDA graph cannot replay."""
        try:
            return bool(ConnectorConfig.from_extra(extra_config).resolved(_kv_on_gpu()).layerwise)
        except Exception:  # a bad config is refused, in one line, when the connector starts
            return True

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVTierStats:
        return KVTierStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KVTierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)


__all__ = ["KVTierConnector"]
