"""A KV connector that does nothing: the control for vLLM's connector path in
``scripts/connector_overhead.py`` (every hook is called, none moves KV)."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)


class NoopConnector(KVConnectorBase_V1):
    """Answers every hook of vLLM's connector API without loading or storing anything."""

    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()
