"""vLLM's OpenAI server with kvtier's connector: requests served, kvtier's series on /metrics."""

from __future__ import annotations

import shutil
import urllib.request
import uuid

import pytest

from kvtier.job.vllm_client import complete_sync, metric_total, parse_metrics


def _metrics(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        return resp.read().decode()


def test_the_servers_metrics_carry_kvtiers_series(text_tokens, tmp_path):
    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.harness.vllm_server import ServerConfig, VllmServer, connector_config

    shm = f"/dev/shm/kvtier-test-{uuid.uuid4().hex[:8]}"
    folder, _, _ = embedded_model_folder()
    connector = connector_config(
        [f"slab://{shm}?size=128MiB", f"slab://{tmp_path}/disk?size=512MiB"]
    )
    config = ServerConfig(
        folder,
        max_model_len=2048,
        kv_transfer_config=connector,
        extra_args=("--no-enable-prefix-caching",),
    )
    prompt = text_tokens[:600]
    try:
        with VllmServer(config, tmp_path / "server.log") as server:
            first = complete_sync(server.base_url, server.model_name, prompt, 8)
            second = complete_sync(server.base_url, server.model_name, prompt, 8)
            text = _metrics(server.base_url)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    assert first.output_ids == second.output_ids
    series = parse_metrics(text, ("kvtier_", "vllm:"))
    names = {key.partition("{")[0] for key in series}
    for name in (
        "kvtier_loaded_tokens_total",
        "kvtier_stored_chunks_total",
        "kvtier_tier_hit_tokens_total",
        "kvtier_kv_wait_seconds_count",
    ):
        assert name in names, f"{name} is not on /metrics"
    assert metric_total(series, "kvtier_loaded_tokens_total") == 512  # two chunks reloaded
    assert metric_total(series, "kvtier_stored_chunks_total") >= 2
    assert metric_total(series, "kvtier_tier_hit_tokens_total", tier="host") == 512
    assert metric_total(series, "kvtier_kv_wait_seconds_count") == 1
    if not any(name.startswith("vllm:") for name in names):
        pytest.fail("vLLM's own series are missing: kvtier's must sit next to them")
