"""vLLM's OpenAI server with kvtier's connector: requests served, kvtier's series on /metrics."""

from __future__ import annotations

import json
import shutil
import urllib.request
import uuid

import pytest


def _complete(base: str, model: str, prompt: list[int]) -> dict:
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    ).encode()
    req = urllib.request.Request(
        f"{base}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def _metrics(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        return resp.read().decode()


def _value(text: str, series: str) -> float:
    """The sum of every sample of ``series`` (all label sets)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(series + "{") or line.startswith(series + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_servers_metrics_carry_kvtiers_series(text_tokens, tmp_path):
    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.engines.vllm.server import ServerConfig, VllmServer

    shm = f"/dev/shm/kvtier-test-{uuid.uuid4().hex[:8]}"
    folder, _, _ = embedded_model_folder()
    connector = {
        "kv_connector": "KVTierConnector",
        "kv_connector_module_path": "kvtier.engines.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "tiers": [f"slab://{shm}?size=128MiB", f"slab://{tmp_path}/disk?size=512MiB"]
        },
    }
    config = ServerConfig(
        folder,
        max_model_len=2048,
        kv_transfer_config=connector,
        extra_args=("--no-enable-prefix-caching",),
    )
    prompt = text_tokens[:600]
    try:
        with VllmServer(config, tmp_path / "server.log") as server:
            first = _complete(server.base_url, server.model_name, prompt)
            second = _complete(server.base_url, server.model_name, prompt)
            text = _metrics(server.base_url)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    for series in (
        "kvtier_loaded_tokens_total",
        "kvtier_stored_chunks_total",
        "kvtier_tier_hit_tokens_total",
        "kvtier_kv_wait_seconds_count",
    ):
        assert series in text, f"{series} is not on /metrics"
    assert _value(text, "kvtier_loaded_tokens_total") == 512  # two 256-token chunks reloaded
    assert _value(text, "kvtier_stored_chunks_total") >= 2
    assert 'tier="host"' in text
    assert _value(text, "kvtier_kv_wait_seconds_count") == 1
    if "vllm:" not in text:
        pytest.fail("vLLM's own series are missing: kvtier's must sit next to them")
