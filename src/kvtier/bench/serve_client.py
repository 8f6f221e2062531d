"""Driving vLLM's own benchmark client for ``kvtier bench serve``: its arguments, its worker
process, and the result file it saves.

The client runs unmodified in :mod:`kvtier.harness.bench_client`, a subprocess that imports
it once and then takes one run per line; :class:`ClientWorker` starts it (in its own process
group, stopped by PID), hands it runs and waits for each with a deadline. :class:`ClientResult`
reads the JSON file the client writes with ``--save-result --save-detailed``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from kvtier.errors import KvtierError
from kvtier.harness.processes import GroupLeader, end_process_group
from kvtier.harness.vllm_server import log_tail

WORKER_MODULE = "kvtier.harness.bench_client"
#: TTFT/TPOT/ITL/E2EL percentiles the client is asked for (p50 and p99 are reported).
PERCENTILES = "50,90,99"


class ClientError(KvtierError):
    """vLLM's benchmark client failed, timed out, or wrote a result that cannot be read."""


@dataclass(frozen=True)
class ClientRun:
    """One run of vLLM's client against one server.

    ``dataset_args``: the dataset's own options (:func:`prefix_repetition_args`,
    :func:`random_args`); the result is saved as ``result_dir/result_name``.
    """

    base_url: str
    model: str
    dataset_args: tuple[str, ...]
    prompts: int
    concurrency: int
    seed: int
    result_dir: Path
    result_name: str
    label: str

    @property
    def result_path(self) -> Path:
        return self.result_dir / self.result_name

    def argv(self) -> list[str]:
        """The client's arguments (those of ``vllm bench serve``)."""
        return [
            "--backend",
            "openai",
            "--base-url",
            self.base_url,
            "--endpoint",
            "/v1/completions",
            "--model",
            self.model,
            *self.dataset_args,
            "--num-prompts",
            str(self.prompts),
            "--max-concurrency",
            str(self.concurrency),
            "--seed",
            str(self.seed),
            "--ignore-eos",
            "--temperature",
            "0",
            "--disable-tqdm",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            PERCENTILES,
            "--label",
            self.label,
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(self.result_dir),
            "--result-filename",
            self.result_name,
        ]


def prefix_repetition_args(
    prefix_tokens: int, suffix_tokens: int, num_prefixes: int, output_tokens: int
) -> tuple[str, ...]:
    """The ``prefix_repetition`` dataset: ``num_prefixes`` random prefixes, each followed by
    random suffixes, prompts shuffled."""
    return (
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        str(prefix_tokens),
        "--prefix-repetition-suffix-len",
        str(suffix_tokens),
        "--prefix-repetition-num-prefixes",
        str(num_prefixes),
        "--prefix-repetition-output-len",
        str(output_tokens),
    )


def sessions_args(dataset_file: Path, output_tokens: int) -> tuple[str, ...]:
    """vLLM's ``custom`` dataset over a file of prompts already rendered as chats
    (:mod:`kvtier.bench.serve_sessions`), sent in the file's order."""
    return (
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset_file),
        "--disable-shuffle",
        "--skip-chat-template",
        "--custom-output-len",
        str(output_tokens),
    )


def random_args(input_tokens: int, output_tokens: int) -> tuple[str, ...]:
    """The ``random`` dataset at fixed lengths: prompts that share nothing."""
    return (
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_tokens),
        "--random-output-len",
        str(output_tokens),
        "--random-range-ratio",
        "0",
    )


def _num(d: Mapping[str, Any], key: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ClientError(f"the client's result has no number {key!r} (got {value!r})")
    return float(value)


def _opt(d: Mapping[str, Any], key: str) -> float | None:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


@dataclass(frozen=True)
class ClientResult:
    """What one client run measured (times in ms, as the client reports them)."""

    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_mean_ms: float
    ttft_median_ms: float
    ttft_p99_ms: float
    tpot_median_ms: float | None
    e2el_median_ms: float | None
    max_concurrency: int | None
    ttfts_s: tuple[float, ...] = ()
    errors: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClientResult:
        """Read the dict ``vllm.benchmarks.serve`` saves (``ClientError`` where it cannot)."""
        if not isinstance(d, Mapping):
            raise ClientError("the client's result is not a JSON object")
        completed = int(_num(d, "completed"))
        failed = int(_opt(d, "failed") or 0)
        ttfts = d.get("ttfts") or ()
        errors = tuple(str(e) for e in (d.get("errors") or ()) if e)
        concurrency = d.get("max_concurrency")
        if completed == 0:  # the client leaves the TTFT figures out or zero then
            median = mean = p99 = 0.0
        else:
            mean = _num(d, "mean_ttft_ms")
            median = _num(d, "median_ttft_ms")
            p99 = _num(d, "p99_ttft_ms")
        return cls(
            completed=completed,
            failed=failed,
            duration_s=_num(d, "duration"),
            input_tokens=int(_num(d, "total_input_tokens")),
            output_tokens=int(_opt(d, "total_output_tokens") or 0),
            request_throughput=_num(d, "request_throughput"),
            output_throughput=_opt(d, "output_throughput") or 0.0,
            total_token_throughput=_num(d, "total_token_throughput"),
            ttft_mean_ms=mean,
            ttft_median_ms=median,
            ttft_p99_ms=p99,
            tpot_median_ms=_opt(d, "median_tpot_ms"),
            e2el_median_ms=_opt(d, "median_e2el_ms"),
            max_concurrency=int(concurrency) if isinstance(concurrency, int) else None,
            ttfts_s=tuple(float(t) for t in ttfts if isinstance(t, int | float) and t > 0),
            errors=errors,
        )

    @classmethod
    def from_file(cls, path: Path) -> ClientResult:
        """Read a result file the client saved."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except OSError as exc:
            raise ClientError(f"cannot read the client's result {path}: {exc}") from None
        except ValueError as exc:
            raise ClientError(f"{path} is not JSON: {exc}") from None

    def as_dict(self, detailed: bool = False) -> dict[str, Any]:
        """JSON-ready dict (the per-request TTFTs only when ``detailed``)."""
        out = asdict(self)
        out["ttfts_s"] = list(self.ttfts_s) if detailed else len(self.ttfts_s)
        out["errors"] = list(self.errors[:3])
        return out


class ClientWorker(GroupLeader):
    """The worker process that runs vLLM's client; use as a context manager.

    ``start`` returns at once (the import of the client overlaps a server's start);
    ``run`` waits for the worker to be ready, then for the run's answer.
    """

    def __init__(self, log_path: Path, env: Mapping[str, str] | None = None):
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self._proc: subprocess.Popen[str] | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._ready = False

    def start(self) -> ClientWorker:
        """Start the worker (its own process group), logging to ``log_path``."""
        if self._proc is not None:
            raise ClientError("the client worker is already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **self.env}
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                start_new_session=True,
            )
        assert self._proc.stdout is not None
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()
        return self

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._answers.put(line)
        self._answers.put(None)

    def _answer(self, deadline: float, what: str) -> dict[str, Any]:
        while True:
            try:
                line = self._answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ClientError(
                    f"vLLM's client did not answer within the time given ({what}); "
                    f"its log: {self.log_path}"
                ) from None
            if line is None:
                raise ClientError(
                    f"vLLM's client worker exited ({what}); the end of its log "
                    f"{self.log_path}:\n{log_tail(self.log_path, 15)}"
                )
            try:
                answer = json.loads(line)
            except ValueError:
                continue  # not one of the worker's answers
            if isinstance(answer, dict):
                return answer

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Wait until the worker has imported the client."""
        if self._proc is None:
            raise ClientError("the client worker is not started")
        if not self._ready:
            self._answer(time.monotonic() + timeout_s, "importing the client")
            self._ready = True

    def run(self, run: ClientRun, timeout_s: float) -> ClientResult:
        """One client run; its saved result."""
        self.wait_ready()
        assert self._proc is not None and self._proc.stdin is not None
        run.result_dir.mkdir(parents=True, exist_ok=True)
        run.result_path.unlink(missing_ok=True)
        try:
            self._proc.stdin.write(json.dumps(run.argv()) + "\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise ClientError(f"cannot reach vLLM's client worker: {exc}") from None
        answer = self._answer(time.monotonic() + timeout_s, f"run {run.label}")
        if not answer.get("ok"):
            raise ClientError(
                f"vLLM's client failed on {run.label}: {answer.get('error')} (log {self.log_path})"
            )
        return ClientResult.from_file(run.result_path)

    def stop(self) -> None:
        """Close the worker's input, then end its process group."""
        proc = self._release()
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        end_process_group(proc, grace_s=5)


__all__ = [
    "PERCENTILES",
    "ClientError",
    "ClientResult",
    "ClientRun",
    "ClientWorker",
    "prefix_repetition_args",
    "random_args",
    "sessions_args",
]
