"""The main job on vLLM: a long-context concurrent workload through vLLM alone, then through vLLM
with kvtier's KV connector, on the same KV pool; one report of both.

Each phase starts its own vLLM OpenAI server (:class:`~kvtier.harness.vllm_server.VllmServer`)
on the embedded model, times a few cold prompts (the warm-up: the engine's prefill curve and
decode step), then plays the workload (:mod:`kvtier.workloads.longctx`) with several sessions in
flight, each request a streamed completion over token ids. The first warm-up sizes the run: the
workload shrinks until both phases fit the time budget, never below 2k-token prompts nor below a
working set larger than the KV pool. kvtier's tiers (a ``slab://`` in ``/dev/shm``, then one on
disk) are sized below the working set too, so KV is evicted from vLLM, spills to disk and comes
back. The connector writes one JSON line per request it looked up; the job joins them to its own
requests by prompt hash, for the tokens each tier held and the engine's wait for KV.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvtier.bench.env import load_average
from kvtier.engines.embedded import embedded_model_folder
from kvtier.engines.vllm.dtype import engine_dtype, short_name
from kvtier.engines.vllm.records import read_records
from kvtier.errors import ConfigError, KvtierError
from kvtier.harness.vllm_server import (
    BLOCK_TOKENS,
    CONNECTOR_MODULE,
    ServerConfig,
    VllmServer,
    check_chunk_tokens,
    connector_config,
    min_pool_blocks,
)
from kvtier.job.progress import Progress, quiet
from kvtier.job.vllm_client import (
    RequestError,
    complete,
    complete_sync,
    metrics_delta,
    prompt_hash,
    scrape_metrics,
    served_model,
)
from kvtier.job.vllm_report import ENGINE_TIER, PhaseResult, RequestRecord, VllmRunReport
from kvtier.job.vllm_sizing import (
    EngineSpeed,
    PrefillCurve,
    Sizing,
    TimeBudget,
    size_workload,
    tier_bytes,
)
from kvtier.keys import ChunkKeyer, Namespace
from kvtier.specs.host import cpu_description
from kvtier.specs.model import model_from_hf_config
from kvtier.workloads.longctx import LongContextSpec, Session, build_sessions

DEFAULT_DIR = Path(".kvtier") / "run"
#: ``--disk-codec`` choices: the disk tier's codec in the kvtier phase, or both (two phases).
DISK_CODECS = ("raw", "kv", "both")
#: The kvtier phase's system name by disk codec when both run.
CODEC_SYSTEMS = {"raw": "vllm+kvtier", "kv": "vllm+kvtier+codec"}
#: With both disk codecs: the tiers' sizes as fractions of the working set (unless given), small
#: enough that the disk tier serves hits and that neither disk holds the whole working set.
CODEC_DRAM_FRACTION = 0.25
CODEC_DISK_FRACTION = 0.5
#: Cold prompts timed at each server's start; the first only warms the engine up.
WARMUP_LENGTHS = (512, 1024, 2048, 4096)
#: Tokens each warm-up request generates beyond its prompt (it must fit the engine's length).
WARMUP_OUTPUT = 8


def warmup_lengths_for(max_model_len: int) -> tuple[int, ...]:
    """The warm-up prompts an engine of ``max_model_len`` tokens can take (the longest of
    :data:`WARMUP_LENGTHS` dropped where they would not fit)."""
    return tuple(n for n in WARMUP_LENGTHS if n + WARMUP_OUTPUT <= max_model_len)


#: The prompt length the reported prefill speed refers to.
REFERENCE_TOKENS = 4096


@dataclass(frozen=True)
class VllmRunConfig:
    """What ``kvtier run --engine vllm`` runs.

    ``pool_blocks``: vLLM's KV pool in 128-token blocks, the same in both phases.
    ``budget_s``: the whole run's target duration; with ``fit_budget`` the workload shrinks to
    it (else it runs as given). ``dram_size``/``disk_size``: kvtier's tiers in bytes (None: sized
    from the workload's working set). ``kvtier``: run the kvtier phase (None: when the connector
    is installed). ``keep``: leave the run's folder (logs, records, disk tier) and the
    ``/dev/shm`` tier in place. ``disk_codec``: the disk tier's ``codec=`` in the kvtier phase;
    ``both`` runs that phase twice on the same tier sizes, raw (``vllm+kvtier``) then coded
    (``vllm+kvtier+codec``), with both tiers below the working set (a quarter and a half of it
    unless given) so that what the codec lets the disk hold shows in tokens and in disk hits.
    ``dtype``: the engine's (and KV's) dtype; ``auto`` follows the CPU (bf16 where native, fp32
    where emulated), except that a disk codec keeps bf16 KV, the dtype the codec is for.
    """

    workload: LongContextSpec = field(default_factory=LongContextSpec)
    pool_blocks: int = 72
    max_model_len: int = 8192
    concurrency: int = 4
    budget_s: float = 300.0
    fit_budget: bool = True
    chunk_tokens: int = 256
    dram_size: int | None = None
    disk_size: int | None = None
    work_dir: Path = DEFAULT_DIR
    shm_dir: Path = Path("/dev/shm")
    kvtier: bool | None = None
    keep: bool = False
    disk_codec: str = "raw"
    dtype: str = "auto"
    warmup_lengths: tuple[int, ...] = WARMUP_LENGTHS
    request_timeout_s: float = 600.0
    startup_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        least = min_pool_blocks(self.max_model_len)
        if self.pool_blocks < least:
            raise ConfigError(
                f"--pool-blocks {self.pool_blocks} cannot hold one {self.max_model_len}-token "
                f"request; give at least {least} (or a smaller --max-model-len)"
            )
        check_chunk_tokens(self.chunk_tokens)
        if self.budget_s <= 0:
            raise ConfigError("--budget must be positive")
        if self.disk_codec not in DISK_CODECS:
            raise ConfigError(
                f"--disk-codec must be one of {', '.join(DISK_CODECS)}, got {self.disk_codec!r}"
            )
        try:
            engine_dtype(self.dtype)
        except ConfigError as exc:
            raise ConfigError(f"--dtype: {exc}") from None
        for option, size in (("--dram-size", self.dram_size), ("--disk-size", self.disk_size)):
            if size is not None and size < 1:
                raise ConfigError(f"{option} must be positive")
        fitted = self.warmup_lengths[1:]
        if len(set(fitted)) < 2 or min(self.warmup_lengths, default=0) < 1:
            raise ConfigError(
                "the warm-up needs a primer and two distinct prompt lengths: give "
                f"--max-model-len {WARMUP_LENGTHS[2] + WARMUP_OUTPUT} or more"
            )
        longest = max(
            self.workload.longest_prompt_tokens() + self.workload.output_tokens,
            max(self.warmup_lengths) + WARMUP_OUTPUT,
        )
        if longest > self.max_model_len:
            raise ConfigError(
                f"the workload's longest request ({longest} tokens with its answer) exceeds the "
                f"engine's max model length {self.max_model_len}"
            )

    def engine_dtype(self) -> str:
        """vLLM's ``--dtype`` for this run."""
        if self.dtype.strip().lower() == "auto" and self.disk_codec != "raw":
            return "bfloat16"
        return engine_dtype(self.dtype)


def connector_available() -> bool:
    """Whether kvtier's vLLM connector module is installed (the kvtier phase can run)."""
    try:
        return importlib.util.find_spec(CONNECTOR_MODULE) is not None
    except (ImportError, ValueError):
        return False


def kv_transfer_config(tiers: list[str], chunk_tokens: int, records: Path) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for kvtier's connector over ``tiers`` (fast→slow), with
    preloading on and its per-request records in ``records``."""
    return connector_config(tiers, chunk_tokens=chunk_tokens, preload=True, records=str(records))


def _mib(n: int) -> str:
    return f"{-(-n // (1 << 20))}MiB"


def tier_urls(
    shm: Path, disk: Path, dram_bytes: int, disk_bytes: int, disk_codec: str = "raw"
) -> list[str]:
    """kvtier's tiers: a host-memory ``slab://`` in ``shm`` (raw: the connector opens a tier
    raw unless its URL names a codec), then a ``slab://`` on disk stored with ``disk_codec``
    (named, so the URL means the same wherever it is opened)."""
    return [
        f"slab://{shm}?size={_mib(dram_bytes)}&name=dram",
        f"slab://{disk}?size={_mib(disk_bytes)}&name=disk&codec={disk_codec}",
    ]


def tokens_held(tiers: list[dict[str, Any]], urls: list[str], chunk_tokens: int) -> dict:
    """What each file tier of a finished phase holds: blocks, their tokens (whole chunks), the
    bytes they take and the tier's capacity, by tier name. Read by opening each namespace
    folder of the tier again once its server has stopped; a tier that cannot be read is left
    out."""
    from kvtier.tiers.registry import open_tier

    held: dict[str, dict[str, int]] = {}
    for info, url in zip(tiers, urls, strict=True):
        blocks = used = capacity = 0
        try:
            folders = [d for d in Path(info["path"]).iterdir() if d.is_dir()]
            for folder in folders:
                tier = open_tier(url, bytes.fromhex(folder.name))
                try:
                    usage = tier.usage()
                finally:
                    tier.close()
                blocks += usage.blocks
                used += usage.used_bytes
                capacity = usage.capacity_bytes
        except (OSError, ValueError, KvtierError):
            continue
        held[info["name"]] = {
            "blocks": blocks,
            "tokens": blocks * chunk_tokens,
            "stored_bytes": used,
            "capacity_bytes": capacity or int(info["bytes"]),
        }
    return held


def warm_up(
    base_url: str, model: str, lengths: tuple[int, ...], spec: LongContextSpec
) -> tuple[EngineSpeed, dict[str, Any]]:
    """Time cold prompts of ``lengths`` tokens (the first only warms up): the engine's speed."""
    rng = np.random.default_rng([spec.seed, 7919])
    points: list[tuple[int, float]] = []
    gaps: list[float] = []
    began = time.perf_counter()
    for i, n in enumerate(lengths):
        prompt = [int(t) for t in rng.integers(spec.vocab[0], spec.vocab[1], n)]
        c = complete_sync(base_url, model, prompt, WARMUP_OUTPUT)
        if i:
            points.append((n, c.ttft_s))
            gaps += list(np.diff(c.token_times_s))
    gaps = [g for g in gaps if g > 0]
    speed = EngineSpeed(
        PrefillCurve.fit(points), statistics.median(gaps) if gaps else points[-1][1] / WARMUP_OUTPUT
    )
    return speed, {"seconds": time.perf_counter() - began, **speed_dict(speed)}


def speed_dict(speed: EngineSpeed) -> dict[str, Any]:
    """An EngineSpeed as the report keeps it, with the prefill speed at REFERENCE_TOKENS."""
    return {
        **speed.to_dict(),
        "prefill_reference_tokens": REFERENCE_TOKENS,
        "prefill_tokens_per_s": speed.prefill.tokens_per_s(REFERENCE_TOKENS),
    }


def run_phase(
    system: str,
    base_url: str,
    model: str,
    spec: LongContextSpec,
    keyer: ChunkKeyer,
    concurrency: int,
    timeout_s: float,
    on_request: Callable[[], None] = lambda: None,
) -> tuple[list[RequestRecord], list[dict[str, Any]], float]:
    """Play the workload against one server: (records, errors, wall seconds)."""
    sessions = build_sessions(spec)
    return asyncio.run(
        _drive(system, base_url, model, sessions, keyer, concurrency, timeout_s, on_request)
    )


async def _drive(
    system: str,
    base_url: str,
    model: str,
    sessions: list[Session],
    keyer: ChunkKeyer,
    concurrency: int,
    timeout_s: float,
    on_request: Callable[[], None],
) -> tuple[list[RequestRecord], list[dict[str, Any]], float]:
    import httpx

    records: list[RequestRecord] = []
    errors: list[dict[str, Any]] = []
    slots = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        t0 = time.perf_counter()

        async def play(session: Session) -> None:
            await asyncio.sleep(max(0.0, t0 + session.arrival_s - time.perf_counter()))
            for step in session.steps():
                if step.delay_s:
                    await asyncio.sleep(step.delay_s)
                due = time.perf_counter() - t0
                async with slots:
                    sent = time.perf_counter() - t0
                    try:
                        c = await complete(client, base_url, model, step.prompt, step.max_tokens)
                    except RequestError as exc:
                        errors.append(
                            {"session": session.name, "turn": step.index, "error": str(exc)}
                        )
                        on_request()
                        return  # the session cannot go on without its answer
                session.answer(c.output_ids)
                cached = c.cached_tokens
                records.append(
                    RequestRecord(
                        session=session.name,
                        kind=session.kind,
                        turn=step.index,
                        due_s=round(due, 6),
                        sent_s=round(sent, 6),
                        prompt_tokens=len(step.prompt),
                        prompt_hash=prompt_hash(step.prompt),
                        block_hashes=[k.hex() for k in keyer.keys(step.prompt)],
                        max_tokens=step.max_tokens,
                        output_tokens=len(c.output_ids),
                        output_hash=xxhash.xxh3_64_hexdigest(
                            np.asarray(c.output_ids, "<u4").tobytes()
                        ),
                        ttft_s=c.ttft_s,
                        e2e_s=c.e2e_s,
                        cached_tokens=cached,
                        hit_tokens={ENGINE_TIER: cached} if cached is not None else {},
                        load_wait_s=None if system != "vllm" else 0.0,
                        server=c.server,
                    )
                )
                on_request()

        await asyncio.gather(*(play(s) for s in sessions))
        wall = time.perf_counter() - t0
    records.sort(key=lambda r: (r.sent_s, r.session))
    return records, errors, wall


def read_connector_records(path: Path) -> list[dict[str, Any]]:
    """The connector's records that name their prompt (what requests are joined by)."""
    return [r for r in read_records(path) if "prompt_hash" in r]


def attach_connector_records(
    records: list[RequestRecord], lines: list[dict[str, Any]]
) -> list[str]:
    """Give each request the connector's view of it (joined by prompt hash): tokens per tier,
    the engine's wait for KV. Returns notes on requests left without one, or disagreeing."""
    by_hash: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_hash.setdefault(str(line["prompt_hash"]), []).append(line)
    missing = mismatched = 0
    for r in records:
        found = by_hash.get(r.prompt_hash)
        if not found:
            missing += 1
            continue
        line = found.pop(0)
        r.connector = line
        hits = {ENGINE_TIER: int(line.get("local_hit_tokens") or 0)}
        promised = 0  # kvtier's hits, as planned when the request was scheduled
        for tier, n in (line.get("hit_tokens") or {}).items():
            hits[str(tier)] = hits.get(str(tier), 0) + int(n)
            promised += int(n)
        r.hit_tokens = hits
        loaded = line.get("loaded_tokens")
        r.unloaded_tokens = max(0, promised - int(loaded)) if loaded is not None else 0
        wait = line.get("load_wait_s")
        r.load_wait_s = float(wait) if wait is not None else 0.0
        if r.cached_tokens is not None and r.cached_tokens != sum(hits.values()):
            mismatched += 1
    notes = []
    if missing:
        notes.append(f"{missing} of {len(records)} requests have no connector record")
    if mismatched:
        notes.append(
            f"{mismatched} requests: vLLM's cached tokens differ from the connector's record "
            "(local + kvtier hits)"
        )
    return notes


@dataclass(frozen=True)
class RunPaths:
    """Where one run keeps its files: logs and records in ``run_dir``, the disk tier inside it,
    the host-memory tier in ``/dev/shm``."""

    run_dir: Path
    shm: Path
    disk: Path
    records: Path

    @classmethod
    def new(cls, work_dir: Path, shm_dir: Path) -> RunPaths:
        run_id = uuid.uuid4().hex[:8]
        run_dir = Path(work_dir).expanduser().resolve() / f"vllm-{run_id}"
        return cls(
            run_dir, Path(shm_dir) / f"kvtier-{run_id}", run_dir / "disk", run_dir / "records.jsonl"
        )

    def for_phase(self, suffix: str) -> RunPaths:
        """Another phase's own tiers and records, in the same run folder."""
        return RunPaths(
            self.run_dir,
            self.shm.with_name(f"{self.shm.name}-{suffix}"),
            self.run_dir / f"disk-{suffix}",
            self.run_dir / f"records-{suffix}.jsonl",
        )

    def clean(self, keep: bool, ok: bool, run_dir: bool = True) -> None:
        """Remove both tiers, and the logs too when the run went well (unless ``keep``;
        ``run_dir=False``: only the tiers)."""
        if keep:
            return
        shutil.rmtree(self.shm, ignore_errors=True)
        shutil.rmtree(self.run_dir if ok and run_dir else self.disk, ignore_errors=True)


class _Steps:
    """The progress bar's count: server starts, warm-up prompts and requests."""

    def __init__(self, progress: Progress, total: int):
        self.progress, self.done, self.total = progress, 0, total

    def tick(self, label: str, n: int = 1) -> None:
        self.done += n
        self.progress(label, self.done, self.total)


def run_vllm_job(config: VllmRunConfig, progress: Progress = quiet) -> VllmRunReport:
    """Run the workload through vLLM alone, then with kvtier; the report of both.

    ``progress`` is called at each server start, warm-up prompt and request.

    A failing kvtier phase does not lose the vLLM-alone one: the report carries it, with the
    error in ``failed`` (its server log kept).
    """
    began = time.perf_counter()
    load_before = load_average()
    folder, fingerprint, model_id = embedded_model_folder()
    dtype = config.engine_dtype()
    geometry = model_from_hf_config(folder).with_dtypes(kv=short_name(dtype))
    namespace = Namespace(
        model_id, fingerprint, dtype, geometry.layers, geometry.kv_heads, geometry.head_dim
    )
    keyer = ChunkKeyer(namespace, BLOCK_TOKENS)  # records key vLLM's blocks, for replays
    kv_per_token = int(geometry.kv_bytes_per_token())
    use_kvtier = connector_available() if config.kvtier is None else config.kvtier
    notes: list[str] = []
    failed: list[str] = []
    if dtype == "float32" and config.dtype.strip().lower() == "auto":  # auto: bf16 is emulated
        notes.append(
            "this CPU emulates bf16: the engine computes in fp32 (--dtype bf16 forces bf16)"
        )
    if config.kvtier is None and not use_kvtier:
        notes.append(f"kvtier's vLLM connector ({CONNECTOR_MODULE}) is not installed: vLLM alone")
    paths = RunPaths.new(config.work_dir, config.shm_dir)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    codecs = ["raw", "kv"] if config.disk_codec == "both" else [config.disk_codec]
    kvtier_phases = len(codecs) if use_kvtier else 0
    servers = 1 + kvtier_phases
    warm = len(config.warmup_lengths)
    steps = _Steps(progress, (1 + warm) * servers + config.workload.requests() * servers)
    base_server = ServerConfig(
        folder,
        dtype=dtype,
        max_model_len=config.max_model_len,
        pool_blocks=config.pool_blocks,
        startup_timeout_s=config.startup_timeout_s,
    )
    phases: list[PhaseResult] = []
    extra_paths: list[RunPaths] = []
    tiers_info: dict[str, Any] = {}
    ok = False
    try:
        steps.tick("starting vLLM", 0)
        with VllmServer(base_server, paths.run_dir / "vllm.log") as server:
            steps.tick("vLLM: warm-up")
            model = served_model(server.base_url)
            speed, warm_info = warm_up(
                server.base_url, model, config.warmup_lengths, config.workload
            )
            steps.tick("vLLM: warm-up", warm - 1)
            sizing = _size(
                config, speed, began, server.startup_s + warm_info["seconds"], kvtier_phases
            )
            steps.total = (1 + warm) * servers + sizing.requests * servers
            phases.append(
                _phase("vllm", server, model, sizing.spec, keyer, config, warm_info, steps)
            )
        notes += list(sizing.notes)
        if use_kvtier:
            both = len(codecs) > 1
            dram_b, disk_b = tier_bytes(
                sizing.working_set_tokens,
                kv_per_token,
                config.chunk_tokens,
                CODEC_DRAM_FRACTION if both else 0.6,
                CODEC_DISK_FRACTION if both else 2.0,
            )
            sizes = (config.dram_size or dram_b, config.disk_size or disk_b)
            tiers_info = _tiers_info(paths, *sizes, config.chunk_tokens, codecs[0])
            tiers_info["chunk_bytes"] = config.chunk_tokens * kv_per_token
            tiers_info["working_set_bytes"] = sizing.working_set_tokens * kv_per_token
            tiers_info["disk_codecs"] = codecs
            for k, codec in enumerate(codecs):
                phase_paths = paths if k == 0 else paths.for_phase(codec)
                if k:
                    extra_paths.append(phase_paths)
                system = CODEC_SYSTEMS[codec] if len(codecs) > 1 else "vllm+kvtier"
                try:
                    phase = _kvtier_phase(
                        system,
                        base_server,
                        phase_paths,
                        sizes,
                        codec,
                        sizing.spec,
                        keyer,
                        config,
                        steps,
                    )
                except KvtierError as exc:
                    failed.append(f"{_label(system)}: {exc}")
                    break
                notes += phase.notes
                phases.append(phase)
        ok = not failed
    finally:
        for extra in extra_paths:
            extra.clean(config.keep, ok, run_dir=False)
        paths.clean(config.keep, ok)
    if config.keep or not ok:
        notes.append(f"logs and records in {paths.run_dir}")
    load_after = load_average()
    cpus = os.cpu_count() or 1
    # the load before the run: afterwards the 1-minute average is mostly the engine's own
    busiest = load_before[0] if load_before else 0.0
    if busiest > cpus / 2:
        notes.append(
            f"the machine was busy before the run (load average {busiest:.1f} on {cpus} "
            "cores): other work may share the CPU with the engine, so the timings are noisy"
        )

    return VllmRunReport(
        machine={
            "cpu": cpu_description(),
            "cpus": cpus,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        model={
            "model_id": model_id,
            "fingerprint": fingerprint,
            "folder": str(folder),
            "dtype": dtype,
            "kv_bytes_per_token": kv_per_token,
            "namespace": asdict(namespace),
        },
        config=_config_dict(config, use_kvtier),
        engine=speed_dict(speed),
        sizing=sizing.to_dict(),
        phases=phases,
        tiers=tiers_info,
        wall_s=time.perf_counter() - began,
        notes=notes,
        failed=failed,
    )


def _tiers_info(
    paths: RunPaths, dram_b: int, disk_b: int, chunk_tokens: int, disk_codec: str = "raw"
) -> dict[str, Any]:
    return {
        "urls": tier_urls(paths.shm, paths.disk, dram_b, disk_b, disk_codec),
        "tiers": [
            {"name": "dram", "size": _mib(dram_b), "bytes": dram_b, "path": str(paths.shm)},
            {"name": "disk", "size": _mib(disk_b), "bytes": disk_b, "path": str(paths.disk)},
        ],
        "chunk_tokens": chunk_tokens,
    }


def _label(system: str) -> str:
    """A phase's name as the progress bar and errors show it."""
    return {
        "vllm": "vLLM",
        "vllm+kvtier": "vLLM + kvtier",
        "vllm+kvtier+codec": "vLLM + kvtier (disk codec)",
    }.get(system, system)


def _kvtier_phase(
    system: str,
    base_server: ServerConfig,
    paths: RunPaths,
    sizes: tuple[int, int],
    disk_codec: str,
    spec: LongContextSpec,
    keyer: ChunkKeyer,
    config: VllmRunConfig,
    steps: _Steps,
) -> PhaseResult:
    """A vLLM + kvtier phase on fresh tiers, its requests joined to the connector's records,
    with what each tier held at its end."""
    info = _tiers_info(paths, *sizes, config.chunk_tokens, disk_codec)
    urls = info["urls"]
    transfer = kv_transfer_config(urls, config.chunk_tokens, paths.records)
    server_config = replace(base_server, kv_transfer_config=transfer)
    label = _label(system)
    steps.tick(f"starting {label}", 0)
    suffix = "" if disk_codec == "raw" else f"-{disk_codec}"
    log = paths.run_dir / f"vllm-kvtier{suffix}.log"
    with VllmServer(server_config, log) as server:
        steps.tick(f"{label}: warm-up")
        model = served_model(server.base_url)
        _, warm = warm_up(server.base_url, model, config.warmup_lengths, config.workload)
        steps.tick(f"{label}: warm-up", len(config.warmup_lengths) - 1)
        phase = _phase(system, server, model, spec, keyer, config, warm, steps)
    phase.notes += attach_connector_records(phase.requests, read_connector_records(paths.records))
    phase.tiers = {
        "urls": urls,
        "disk_codec": disk_codec,
        "held": tokens_held(info["tiers"], urls, config.chunk_tokens),
    }
    return phase


def _size(
    config: VllmRunConfig, speed: EngineSpeed, began: float, next_start_s: float, kvtier: int
) -> Sizing:
    """The workload fitted to the budget: one vLLM-alone phase and ``kvtier`` kvtier phases."""
    budget = TimeBudget(
        total_s=config.budget_s,
        spent_s=time.perf_counter() - began,
        next_start_s=next_start_s * kvtier,
        kvtier_factor=float(kvtier),
    )
    pool_tokens = config.pool_blocks * BLOCK_TOKENS
    if not config.fit_budget:
        return size_workload(config.workload, speed, float("inf"), pool_tokens, config.concurrency)
    return size_workload(config.workload, speed, budget.phase_s, pool_tokens, config.concurrency)


def _phase(
    system: str,
    server: VllmServer,
    model: str,
    spec: LongContextSpec,
    keyer: ChunkKeyer,
    config: VllmRunConfig,
    warm: dict[str, Any],
    steps: _Steps,
) -> PhaseResult:
    label = f"{_label(system)}: requests"
    steps.tick(label, 0)
    before = scrape_metrics(server.base_url)
    records, errors, wall = run_phase(
        system,
        server.base_url,
        model,
        spec,
        keyer,
        config.concurrency,
        config.request_timeout_s,
        lambda: steps.tick(label),
    )
    after = scrape_metrics(server.base_url)
    if not records:
        first = errors[0]["error"] if errors else "no request ran"
        raise RequestError(f"{system}: every request failed ({first}); log {server.log_path}")
    return PhaseResult(
        system=system,
        startup_s=server.startup_s,
        warmup=warm,
        wall_s=wall,
        requests=records,
        errors=errors,
        metrics=metrics_delta(before, after),
        metrics_after=after,
        server={"pool_blocks": config.pool_blocks, "max_model_len": config.max_model_len},
    )


def _config_dict(config: VllmRunConfig, kvtier: bool) -> dict[str, Any]:
    out = asdict(config)
    out["workload"] = asdict(config.workload)
    out["work_dir"] = str(config.work_dir)
    out["shm_dir"] = str(config.shm_dir)
    out["kvtier"] = kvtier
    out["record_block_tokens"] = BLOCK_TOKENS
    return out


__all__ = [
    "CODEC_SYSTEMS",
    "CONNECTOR_MODULE",
    "DEFAULT_DIR",
    "DISK_CODECS",
    "RunPaths",
    "VllmRunConfig",
    "attach_connector_records",
    "connector_available",
    "kv_transfer_config",
    "read_connector_records",
    "run_phase",
    "run_vllm_job",
    "tier_urls",
    "tokens_held",
    "warm_up",
]
