"""``kvtier bench reload``: TTFT of prompts kvtier holds against the same engine recomputing.

Two set-ups, each on real vLLM servers with kvtier's connector, timed by one-token completions
(a prompt's prefill and its first token):

- ``restart``: an engine (``tp`` ranks) computes ``prompts`` prompts and stores them on a disk
  tier, and stops; a new engine on the same tier then serves those prompts (loaded from disk,
  every rank its own part) alternating with as many fresh prompts of the same length
  (recomputed). The ratio is the fresh prompts' median TTFT over the stored ones'.
- ``pd``: a prefill engine (``kv_producer``) and a decode engine (``kv_consumer``) share a tier
  (a disk directory both open, or ``shared``: a ``redis://``/``s3://`` URL). Each prompt is sent
  to the producer with one output token, then to the consumer with the producer's
  ``kv_transfer_params``, as vLLM's proxy pattern does; a fresh prompt sent to the consumer alone
  is the recompute reference, alternating.

The connector's records say how many tokens each request loaded and whether any block failed,
so a "load" that was really a recompute shows.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.bench.serve import vocab_range
from kvtier.engines.vllm.records import prompt_hash, read_records
from kvtier.errors import ConfigError
from kvtier.harness.vllm_server import ServerConfig, VllmServer, connector_config

MODES = ("restart", "pd")
#: The target: a held prompt's TTFT at least this many times faster than recomputing it.
TARGET = 3.0


@dataclass(frozen=True)
class ReloadConfig:
    """One ``kvtier bench reload`` run (see the module docstring)."""

    mode: str = "restart"
    tp: int = 1
    prompts: int = 4
    prompt_tokens: int = 4160
    chunk_tokens: int = 256
    shared: str | None = None
    directory: Path = Path(".kvtier/bench-reload")
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode is one of {', '.join(MODES)}, not {self.mode!r}")
        if self.tp < 1 or self.prompts < 1:
            raise ConfigError("--tp and --prompts must be at least 1")
        if self.prompt_tokens < 2 * self.chunk_tokens:
            raise ConfigError(
                f"--prompt-tokens must be at least two chunks ({2 * self.chunk_tokens})"
            )
        if self.shared is not None and self.mode != "pd":
            raise ConfigError("--shared is the tier a producer and a consumer share: --mode pd")

    @property
    def max_model_len(self) -> int:
        """Room for one prompt and its token, in whole vLLM blocks."""
        return -(-(self.prompt_tokens + 16) // 128) * 128


@dataclass
class Sample:
    """One timed request: its prompt's kind (``held`` or ``fresh``), TTFT, and what the
    connector's record says it loaded."""

    kind: str
    ttft_s: float
    loaded_tokens: int = 0
    failed_blocks: int = 0


@dataclass
class ReloadReport:
    """The samples of one run, and the ratio the target is judged by."""

    config: ReloadConfig
    samples: list[Sample] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)

    def median(self, kind: str) -> float | None:
        """Median TTFT of the samples of ``kind``."""
        values = [s.ttft_s for s in self.samples if s.kind == kind]
        return statistics.median(values) if values else None

    def speedup(self) -> float | None:
        """Fresh prompts' median TTFT over held prompts'."""
        held, fresh = self.median("held"), self.median("fresh")
        return fresh / held if held and fresh else None

    def all_loaded(self) -> bool:
        """Whether every held prompt loaded all its whole chunks but the last token's, intact."""
        whole = (
            (self.config.prompt_tokens - 1) // self.config.chunk_tokens * self.config.chunk_tokens
        )
        held = [s for s in self.samples if s.kind == "held"]
        return bool(held) and all(s.loaded_tokens >= whole and not s.failed_blocks for s in held)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        config = asdict(self.config)
        config["directory"] = str(self.config.directory)
        speedup = self.speedup()
        return {
            "config": config,
            "engine": self.engine,
            "samples": [asdict(s) for s in self.samples],
            "held_ttft_p50_s": self.median("held"),
            "fresh_ttft_p50_s": self.median("fresh"),
            "speedup": speedup,
            "all_loaded": self.all_loaded(),
            "target": TARGET,
            "passed": None if speedup is None else speedup >= TARGET and self.all_loaded(),
        }


def completion(
    base_url: str, model: str, prompt: list[int], params: dict | None
) -> tuple[float, dict]:
    """Seconds one non-streamed one-token completion takes, and its response."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    if params:
        body["kv_transfer_params"] = params
    request = urllib.request.Request(
        base_url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    return time.perf_counter() - began, answer


class ReloadBench:
    """Runs one :class:`ReloadConfig`; ``on_step(label)`` hears each step."""

    def __init__(self, config: ReloadConfig, model: Path):
        self.config = config
        self.model = model
        self.on_step: Callable[[str], None] = lambda label: None
        rng = np.random.default_rng(config.seed)
        low, high = vocab_range(model)
        n, size = config.prompts, config.prompt_tokens
        prompts = [[int(t) for t in rng.integers(low, high, size)] for _ in range(2 * n + 1)]
        self.held, self.fresh, self.warm = prompts[:n], prompts[n : 2 * n], prompts[-1]

    def steps(self) -> int:
        """Steps :meth:`run` reports (for a progress bar)."""
        return 2 + 3 * self.config.prompts

    def _server(self, name: str, tiers: list[str], role: str, records: Path) -> VllmServer:
        c = self.config
        transfer = connector_config(tiers, chunk_tokens=c.chunk_tokens, records=str(records))
        transfer["kv_role"] = role
        env = {"OMP_NUM_THREADS": "1"} if c.tp > 1 else {}
        extra = ("--tensor-parallel-size", str(c.tp)) if c.tp > 1 else ()
        config = ServerConfig(
            self.model,
            max_model_len=c.max_model_len,
            kv_transfer_config=transfer,
            extra_args=extra,
            env=env,
            startup_timeout_s=600.0,
        )
        return VllmServer(config, c.directory / f"{name}.log")

    def run(self) -> ReloadReport:
        """Start the engines, send the prompts, and time them."""
        c = self.config
        c.directory.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:8]
        report = ReloadReport(c)
        report.engine = {"tp": c.tp, "threads_per_rank": 1 if c.tp > 1 else None}
        if c.mode == "restart":
            self._restart(report, [f"slab://{c.directory}/disk-{tag}?size=8GiB"])
        else:
            shared = c.shared or f"slab://{c.directory}/shared-{tag}?size=8GiB"
            self._disaggregated(report, shared)
        return report

    def _restart(self, report: ReloadReport, tiers: list[str]) -> None:
        c = self.config
        first = c.directory / "first.jsonl"
        self.on_step("engine that stores")
        with self._server("first", tiers, "kv_both", first) as server:
            for i, prompt in enumerate(self.held):
                self.on_step(f"storing prompt {i + 1}")
                completion(server.base_url, server.model_name, prompt, None)
        records = c.directory / "restarted.jsonl"
        self.on_step("restarted engine")
        with self._server("restarted", tiers, "kv_both", records) as server:
            completion(server.base_url, server.model_name, self.warm, None)
            self._alternate(report, server, None)
        self._join(report, records)

    def _disaggregated(self, report: ReloadReport, shared: str) -> None:
        c = self.config
        produced, consumed = c.directory / "producer.jsonl", c.directory / "consumer.jsonl"
        self.on_step("producer and consumer")
        with (
            self._server("producer", [shared], "kv_producer", produced) as producer,
            self._server("consumer", [shared], "kv_consumer", consumed) as consumer,
        ):
            completion(consumer.base_url, consumer.model_name, self.warm, None)
            self.on_step("engines up")
            self._alternate(report, consumer, producer)
        self._join(report, consumed)

    def _alternate(
        self, report: ReloadReport, server: VllmServer, producer: VllmServer | None
    ) -> None:
        """Time each held prompt on ``server`` (prefilled on ``producer`` first, when there is
        one) and a fresh prompt beside it, the order flipped each time."""
        model = server.model_name
        for i, (held, fresh) in enumerate(zip(self.held, self.fresh, strict=True)):
            params = None
            if producer is not None:
                self.on_step(f"prefill {i + 1}")
                _, answer = completion(producer.base_url, producer.model_name, held, None)
                params = answer.get("kv_transfer_params")
            order = [("held", held, params), ("fresh", fresh, None)]
            for kind, prompt, p in order if i % 2 == 0 else order[::-1]:
                self.on_step(f"{kind} {i + 1}")
                seconds, _ = completion(server.base_url, model, prompt, p)
                report.samples.append(Sample(kind, seconds))

    def _join(self, report: ReloadReport, records: Path) -> None:
        """Each sample's loaded tokens and failed blocks, from the connector's records."""
        by_hash: dict[str, dict] = {}
        for rec in read_records(records):
            by_hash[rec["prompt_hash"]] = rec
        prompts = {"held": iter(self.held), "fresh": iter(self.fresh)}
        for sample in report.samples:
            rec = by_hash.get(prompt_hash(next(prompts[sample.kind])), {})
            sample.loaded_tokens = int(rec.get("loaded_tokens", 0) or 0)
            sample.failed_blocks = int(rec.get("failed_blocks", 0) or 0)


def render(report: ReloadReport, console) -> None:
    """The run as a rich table."""
    from rich.table import Table

    data = report.to_dict()
    c = report.config
    table = Table(
        title=f"bench reload: {c.mode}, TP {c.tp}, {c.prompts} × {c.prompt_tokens} tokens"
    )
    for column in ("prompts", "TTFT p50 (s)", "loaded tokens"):
        table.add_column(column)
    for kind in ("held", "fresh"):
        loaded = [s.loaded_tokens for s in report.samples if s.kind == kind]
        p50 = report.median(kind)
        table.add_row(kind, "—" if p50 is None else f"{p50:.3f}", str(loaded))
    console.print(table)
    speedup = data["speedup"]
    console.print(
        f"held prompts {'—' if speedup is None else f'{speedup:.2f}×'} faster than recomputing "
        f"(target ≥ {TARGET:.0f}×, every held prompt loaded whole: {data['all_loaded']})"
    )


__all__ = ["MODES", "ReloadBench", "ReloadConfig", "ReloadReport", "Sample", "render"]
