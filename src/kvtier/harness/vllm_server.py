"""vLLM's OpenAI-compatible server as a subprocess: started on a free local port, stopped by PID.

:class:`VllmServer` runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script of the CPU build does not start) with the interpreter running kvtier, logs to a file,
and waits for ``/health``. Leaving the ``with`` block — normally or on an exception — sends
SIGTERM to the server, then SIGKILL to its process group (the engine core is a child process).
vLLM itself is never imported here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.engines.vllm.dtype import engine_dtype
from kvtier.errors import ConfigError, KvtierError
from kvtier.harness.processes import (
    GroupLeader,
    end_process_group,
    group_cpu_by_name,
    group_cpu_seconds,
)
from kvtier.specs.host import free_port

#: Tokens per vLLM KV block on its CPU backend (what ``--num-gpu-blocks-override`` counts).
BLOCK_TOKENS = 128
MODULE = "vllm.entrypoints.openai.api_server"
#: kvtier's connector as vLLM loads it out of tree.
CONNECTOR_MODULE = "kvtier.engines.vllm.connector"
CONNECTOR_CLASS = "KVTierConnector"


def connector_config(tiers: list[str], **options: Any) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for kvtier's connector over ``tiers`` (fast→slow), a load
    that fails recomputed; ``options`` are more ``kv_connector_extra_config`` keys
    (``chunk_tokens``, ``preload``, ``records`` …)."""
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"tiers": list(tiers), **options},
    }


class VllmServerError(KvtierError):
    """The vLLM server did not start or died; the message carries the end of its log."""


@dataclass(frozen=True)
class ServerConfig:
    """How to start one vLLM server.

    ``pool_blocks``: the engine's KV pool in :data:`BLOCK_TOKENS`-token blocks
    (``--num-gpu-blocks-override``); None leaves it to ``kvcache_gib`` (``VLLM_CPU_KVCACHE_SPACE``,
    whole GiB). ``kv_transfer_config``: vLLM's ``--kv-transfer-config`` as a dict (a KV
    connector). ``request_details`` adds each request's cached tokens and server-side timings to
    its final usage chunk (``--enable-prompt-tokens-details --enable-per-request-metrics``).
    ``extra_args`` are appended to the command line, ``env`` to the environment. ``dtype``:
    the engine's (and its KV's) dtype; ``auto`` follows the CPU (see
    :func:`kvtier.engines.vllm.dtype.engine_dtype`).
    """

    model: Path
    dtype: str = "auto"
    max_model_len: int = 8192
    pool_blocks: int | None = None
    kvcache_gib: int = 1
    kv_transfer_config: Mapping[str, Any] | None = None
    request_details: bool = True
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        engine_dtype(self.dtype)  # an unknown name is refused here
        if self.pool_blocks is not None and self.pool_blocks < min_pool_blocks(self.max_model_len):
            raise ConfigError(
                f"a pool of {self.pool_blocks} blocks ({self.pool_blocks * BLOCK_TOKENS} tokens) "
                f"cannot hold one {self.max_model_len}-token request; give at least "
                f"{min_pool_blocks(self.max_model_len)} blocks"
            )
        if self.kvcache_gib < 1:
            raise ConfigError("kvcache_gib is in whole GiB, at least 1")

    def command(self, port: int) -> list[str]:
        """The server's command line (its interpreter is the one running kvtier)."""
        cmd = [
            sys.executable,
            "-m",
            MODULE,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            str(self.model),
            "--dtype",
            engine_dtype(self.dtype),
            "--enforce-eager",
            "--max-model-len",
            str(self.max_model_len),
        ]
        if self.pool_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.pool_blocks)]
        if self.kv_transfer_config is not None:
            cmd += ["--kv-transfer-config", json.dumps(dict(self.kv_transfer_config))]
        if self.request_details:
            cmd += ["--enable-prompt-tokens-details", "--enable-per-request-metrics"]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        """The server's environment: this one, the CPU backend's settings, then ``env``."""
        env = dict(os.environ)
        env.update(
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            VLLM_CPU_KVCACHE_SPACE=str(self.kvcache_gib),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        return env


def min_pool_blocks(max_model_len: int) -> int:
    """The smallest pool vLLM starts with: one request of ``max_model_len`` tokens, plus one."""
    return -(-max_model_len // BLOCK_TOKENS) + 1


def check_chunk_tokens(chunk_tokens: int) -> None:
    """ConfigError unless ``chunk_tokens`` (``--chunk-tokens``) is a whole number of vLLM's
    :data:`BLOCK_TOKENS`-token blocks: the connector stores and loads whole blocks."""
    if chunk_tokens < BLOCK_TOKENS or chunk_tokens % BLOCK_TOKENS:
        raise ConfigError(f"--chunk-tokens must be a multiple of vLLM's {BLOCK_TOKENS}-token block")


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file (empty when it cannot be read)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class VllmServer(GroupLeader):
    """A running vLLM OpenAI server; use as a context manager.

    ``base_url`` is ``http://127.0.0.1:<port>``; ``startup_s`` how long the start took;
    ``model_name`` the served model's name (its folder).
    """

    def __init__(self, config: ServerConfig, log_path: Path):
        self.config = config
        self.log_path = Path(log_path)
        self.port = 0
        self.startup_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_name(self) -> str:
        return str(self.config.model)

    def cpu_seconds(self) -> float:
        """CPU seconds the server's processes (API server, engine core, worker) have used so
        far (0.0 when it is not running)."""
        return group_cpu_seconds(self._proc.pid) if self._proc is not None else 0.0

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds each of the server's processes has used so far, by process name (the
        engine core's and the worker's apart; empty when it is not running)."""
        return group_cpu_by_name(self._proc.pid) if self._proc is not None else {}

    def start(self) -> VllmServer:
        """Start the server and wait until ``/health`` answers (VllmServerError otherwise)."""
        if self._proc is not None:
            raise VllmServerError("this server is already started")
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.config.command(self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.config.environment(),
                start_new_session=True,  # its own process group, so the engine core goes too
            )
        try:
            self._wait_healthy(began + self.config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - began
        return self

    def _wait_healthy(self, deadline: float) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise VllmServerError(
                    f"vLLM exited with code {code} while starting (log {self.log_path}):\n"
                    f"{log_tail(self.log_path)}"
                )
            if self.healthy():
                return
            if time.perf_counter() > deadline:
                raise VllmServerError(
                    f"vLLM did not answer /health within {self.config.startup_timeout_s:.0f} s "
                    f"(log {self.log_path}):\n{log_tail(self.log_path)}"
                )
            time.sleep(0.5)

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200 now."""
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the server, wait up to ``grace_s``, then SIGKILL its process group.

        Returns the server's exit code (None if it was never started)."""
        proc = self._release()
        if proc is None:
            return None
        return end_process_group(proc, grace_s, term=True)


__all__ = [
    "BLOCK_TOKENS",
    "CONNECTOR_CLASS",
    "CONNECTOR_MODULE",
    "ServerConfig",
    "VllmServer",
    "VllmServerError",
    "check_chunk_tokens",
    "connector_config",
    "free_port",
    "log_tail",
    "min_pool_blocks",
]
