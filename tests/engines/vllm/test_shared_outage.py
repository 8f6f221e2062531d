"""vLLM's OpenAI server with kvtier's connector over a Redis tier whose real server is paused
(SIGSTOP: it accepts and never answers), resumed, killed (SIGKILL) and started again, while
requests keep coming: every request is answered with the tokens it gets with Redis up, no
exception reaches the engine, the breaker keeps the tier's timeouts to a few per outage, the
outage is on ``/metrics``, and Redis serves KV again within 5 s of answering again: once 5 s
have passed (the breaker's longest back-off is 4 s), the next request loads from it. That is
counted in requests, not timed, so a slow CPU (one whose cold requests take longer than the
back-off) cannot stretch it."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from kvtier.job.vllm_client import complete_sync, metric_total, scrape_metrics
from kvtier.testing import services

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT_TOKENS = 600  # two 256-token chunks kvtier can load, the rest computed
RESUME_S = 5.0  # longer than the breaker's longest back-off (TieredCacheConfig: 4 s)
TIMEOUT_S = 0.1  # the tier's bound on one operation (its default)


def _complete(base: str, model: str, prompt: list[int]) -> list[int]:
    return complete_sync(base, model, prompt, 8, timeout_s=300).output_ids


def _series(base: str, name: str) -> float:
    """The sum of kvtier's counter ``name`` for the Redis tier on ``/metrics``."""
    return metric_total(scrape_metrics(base, 30), f"kvtier_{name}_total", tier="redis")


def _within(check, attempts: int, what: str, log: Path) -> int:
    """Try ``check`` until it holds; the attempts it took (a failure past ``attempts``, with
    kvtier's lines of the server's log: why each load fell short)."""
    for n in range(1, attempts + 1):
        if check():
            return n
    lines = [line for line in log.read_text(errors="replace").splitlines() if "kvtier" in line]
    tail = "\n".join(lines[-20:])
    pytest.fail(f"{what} did not happen within {attempts} requests; kvtier's log:\n{tail}")


def test_requests_survive_a_paused_and_a_killed_redis(text_tokens, tmp_path):
    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.harness.vllm_server import ServerConfig, VllmServer, connector_config

    redis = services.start_redis(tmp_path / "redis")
    tag = uuid.uuid4().hex[:8]
    connector = connector_config(
        [f"{redis.url}?prefix=outage-{tag}&timeout={TIMEOUT_S}&name=redis"]
    )
    folder, _, _ = embedded_model_folder()
    config = ServerConfig(
        folder,
        max_model_len=2048,
        kv_transfer_config=connector,
        extra_args=("--no-enable-prefix-caching",),
    )
    prompts = [text_tokens[i * PROMPT_TOKENS : (i + 1) * PROMPT_TOKENS] for i in range(5)]
    try:
        with VllmServer(config, tmp_path / "server.log") as server:
            base, model = server.base_url, server.model_name
            hits = lambda: _series(base, "tier_hit_tokens")  # noqa: E731

            def reload(prompt: list[int], want: str, attempts: int) -> int:
                """Ask for ``prompt`` until kvtier loads it from Redis (answers stay right);
                the requests it took."""
                before = hits()

                def loaded() -> bool:
                    assert _complete(base, model, prompt) == want
                    return hits() > before

                return _within(loaded, attempts, "a load from Redis", tmp_path / "server.log")

            # Redis up: the first answer is computed and stored, a repeat loads it (the store
            # is asynchronous: it may land after the first repeat's look-up).
            first = _complete(base, model, prompts[0])
            reload(prompts[0], first, 3)

            # Paused: it accepts and never answers. Answers are recomputed, right, and the
            # breaker pays the timeout a few times per outage, not on every operation.
            redis.signal(signal.SIGSTOP)
            for p in (prompts[0], prompts[1], prompts[0], prompts[2], prompts[0]):
                answer = _complete(base, model, p)
                assert p is not prompts[0] or answer == first
            errors_paused = _series(base, "tier_errors")
            assert _series(base, "tier_outages") >= 1
            assert 1 <= errors_paused <= 12
            redis.signal(signal.SIGCONT)
            time.sleep(RESUME_S)
            reload(prompts[0], first, 1)  # the first request after 5 s loads

            # Killed: connections are refused; answers stay right, the outage is counted.
            outages = _series(base, "tier_outages")
            redis.signal(signal.SIGKILL)
            for p in (prompts[0], prompts[4], prompts[0]):
                answer = _complete(base, model, p)
                assert p is not prompts[0] or answer == first
            assert _series(base, "tier_outages") > outages
            # Started again, empty: 5 s on, new KV is stored there and loaded back.
            redis = services.restart(redis)
            time.sleep(RESUME_S)
            third = _complete(base, model, prompts[3])
            back = reload(prompts[3], third, 3)
    finally:
        redis.stop()
    log = (tmp_path / "server.log").read_text(errors="replace")
    serving = log.split("[shutdown]", 1)[0]  # vLLM's own abort at shutdown may log one
    assert "Traceback" not in serving, "an exception reached the engine: see server.log"
    print(f"paused: {errors_paused:.0f} tier errors; {RESUME_S:.0f} s after SIGCONT, Redis served")
    print(f"the first request; after its restart, repeats until a load: {back}")
