"""The vLLM server wrapper: its command line and environment, and that a server which fails to
start is reported with its log and leaves no process behind. (It lives in
``engines.vllm.server``; its tests sit with the job that uses it.)"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path

import pytest

from kvtier.engines.vllm.dtype import engine_dtype
from kvtier.errors import ConfigError
from kvtier.harness.vllm_server import (
    ServerConfig,
    VllmServer,
    VllmServerError,
    check_chunk_tokens,
    free_port,
    log_tail,
    min_pool_blocks,
)

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make setup-vllm)"
)


def test_the_command_line_runs_the_api_server_module_with_the_pool_and_connector():
    cfg = ServerConfig(
        Path("/models/m"),
        pool_blocks=80,
        kv_transfer_config={"kv_connector": "KVTierConnector", "kv_role": "kv_both"},
    )
    cmd = cfg.command(8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(itertools.pairwise(cmd))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--model"] == "/models/m" and pairs["--dtype"] == engine_dtype("auto")
    assert pairs["--max-model-len"] == "8192" and pairs["--num-gpu-blocks-override"] == "80"
    assert json.loads(pairs["--kv-transfer-config"])["kv_connector"] == "KVTierConnector"
    assert "--enforce-eager" in cmd and "--enable-prompt-tokens-details" in cmd
    assert (
        dict(itertools.pairwise(ServerConfig(Path("/m"), dtype="fp32").command(1)))["--dtype"]
        == "float32"
    )
    with pytest.raises(ConfigError, match="engine dtype"):
        ServerConfig(Path("/m"), dtype="fp4")
    plain = ServerConfig(Path("/m"), request_details=False).command(1)
    assert "--num-gpu-blocks-override" not in plain and "--kv-transfer-config" not in plain
    assert "--enable-per-request-metrics" not in plain


def test_the_environment_sets_the_cpu_backend():
    env = ServerConfig(Path("/m"), kvcache_gib=2, env={"EXTRA": "1"}).environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["EXTRA"] == "1"


def test_a_pool_too_small_for_one_request_is_refused():
    assert min_pool_blocks(8192) == 65
    with pytest.raises(ConfigError, match="at least 65"):
        ServerConfig(Path("/m"), pool_blocks=64)
    ServerConfig(Path("/m"), pool_blocks=65)


def test_chunks_must_be_whole_vllm_blocks():
    check_chunk_tokens(128)
    check_chunk_tokens(512)
    for bad in (0, 64, 192):
        with pytest.raises(ConfigError, match="multiple of vLLM's 128-token block"):
            check_chunk_tokens(bad)


def test_free_port_and_log_tail(tmp_path):
    assert 0 < free_port() < 65536
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, 3) == "line 97\nline 98\nline 99"
    assert log_tail(tmp_path / "missing.log") == ""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers; its state says it is done
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@needs_vllm
@pytest.mark.slow
def test_a_server_that_exits_is_reported_with_its_log(tmp_path):
    server = VllmServer(
        ServerConfig(tmp_path / "no-model", extra_args=("--no-such-flag",)), tmp_path / "s.log"
    )
    with pytest.raises(VllmServerError, match="exited with code") as info:
        server.start()
    assert "no-such-flag" in str(info.value)  # the log's end is in the message
    assert server.pid is None


@needs_vllm
def test_a_server_that_does_not_answer_in_time_is_killed(tmp_path):
    server = VllmServer(ServerConfig(tmp_path, startup_timeout_s=1.0), tmp_path / "s.log")
    pids: list[int] = []
    real = server._wait_healthy

    def wait(deadline: float) -> None:
        pids.append(server.pid or 0)
        real(deadline)

    server._wait_healthy = wait  # type: ignore[method-assign]
    with pytest.raises(VllmServerError, match="within 1 s"):
        server.start()
    assert pids and pids[0] > 0 and _gone(pids[0])
