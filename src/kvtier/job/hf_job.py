"""The main job: a realistic workload through a real model, with kvtier and recompute-only.

Every request of the workload (chat sessions sharing a system prompt, RAG questions over shared
documents, agentic sessions pausing for tool calls; see :mod:`kvtier.workloads.sessions`) runs
twice, back to back on the same token ids: once through an :class:`~kvtier.engines.hf.HFEngine`
over a :class:`~kvtier.cache.TieredCache` (DRAM, local disk, and any extra tiers) deciding per
request whether to reload or recompute, once through the same engine without a cache. Greedy
decoding makes both produce the same answer, which the next turn of the session builds on; the run
checks that they do.

Between the two runs of a request the cache's queued writes are flushed, so the recompute-only
run never competes with kvtier's background stores (and the next request finds the chunks).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvtier.bench.env import load_average
from kvtier.cache.hints import ReuseHints
from kvtier.cost.online import RefinedCompute
from kvtier.engines.profile import (
    ProfileInfo,
    QuickPlan,
    break_even,
    calibration_namespace,
    obtain_profile,
    roomy,
)
from kvtier.errors import ConfigError
from kvtier.job.decision import LoggedDecision, QueueProbe, decision_entry, judge
from kvtier.job.hf_report import RequestResult, RunReport
from kvtier.job.progress import Progress, quiet
from kvtier.policy.reuse import REUSE_PRIORS, HintedAdmission, chunk_values
from kvtier.workloads.sessions import WorkloadSpec, build_sessions, interleave

DEFAULT_DIR = Path(".kvtier") / "run"

#: The default workload (WorkloadSpec's defaults are sized for `kvtier run`).
DEFAULT_WORKLOAD = WorkloadSpec()


@dataclass(frozen=True)
class RunConfig:
    """What `kvtier run` runs: model, tiers, workload and how the decision is calibrated."""

    model: str = "embedded"
    dtype: str = "bf16"
    device: str | None = None
    chunk_tokens: int = 64
    dram_size: str = "8MiB"
    disk_dir: Path = DEFAULT_DIR
    disk_size: str = "4GiB"
    extra_tiers: tuple[str, ...] = ()
    workload: WorkloadSpec = DEFAULT_WORKLOAD
    profile_path: Path | None = None
    calibrate: bool = False
    quick_plan: QuickPlan = field(default_factory=QuickPlan)
    admission: bool = True
    reuse_disk: bool = False
    keep_disk: bool = False
    pauses: bool = True
    check_break_even: bool = True
    refine: bool = True
    exact: bool = False

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ConfigError("--chunk-tokens must be at least 1")

    def tier_urls(self) -> list[tuple[str, str]]:
        """(URL, tier name) of every tier, fast→slow: DRAM, local disk, then the extra ones."""
        disk = Path(self.disk_dir).expanduser().resolve()
        urls = [
            (f"memory://?size={self.dram_size}&name=dram", "dram"),
            (f"slab://{disk}?size={self.disk_size}&name=disk", "disk"),
        ]
        for i, url in enumerate(self.extra_tiers):
            urls.append((url, _tier_name(url, i)))
        return urls


def _tier_name(url: str, i: int) -> str:
    """The ``name=`` of an extra tier's URL (checked like its tier would), else a scheme name."""
    from kvtier.tiers.base import TierURL
    from kvtier.tiers.registry import options_class
    from kvtier.tiers.url import parse_options

    parsed = TierURL.parse(url)
    cls = options_class(parsed.scheme)
    name = getattr(parse_options(cls, parsed), "name", None) if cls else parsed.options.get("name")
    return name or (parsed.scheme if i == 0 else f"{parsed.scheme}{i}")


def total_steps(spec: WorkloadSpec) -> int:
    """Progress steps of a run: setup (3) plus one per request."""
    sessions = build_sessions(spec)
    return 3 + sum(len(s.turns) for s in sessions)


def run_job(config: RunConfig, loaded=None, progress: Progress = quiet) -> RunReport:
    """Run the workload with kvtier and recompute-only; the report of both.

    ``progress`` is called at each setup stage and once per request (both runs of it).

    ``loaded``: an already loaded :class:`~kvtier.engines.embedded.LoadedModel` (must have a
    tokenizer); otherwise ``config.model`` is loaded.
    """
    import torch

    from kvtier.cache import CacheConfig, TieredCache, TierOptions
    from kvtier.engines.embedded import load_model
    from kvtier.engines.hf import HFEngine, model_namespace
    from kvtier.engines.kv_layout import KVLayout
    from kvtier.policy.decision import LoadOrRecompute
    from kvtier.tiers.registry import open_tier

    began = time.perf_counter()
    spec = config.workload
    steps = total_steps(spec)
    step = 0
    progress("loading the model", step, steps)
    t0 = time.perf_counter()
    if loaded is None:
        dev = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        loaded = load_model(config.model, config.dtype, device=dev)
    if loaded.tokenizer is None:
        raise ConfigError("kvtier run needs the model's tokenizer; load it with tokenizer=True")
    model_load_s = time.perf_counter() - t0
    step += 1
    model = loaded.model
    layout = KVLayout.from_model(model)
    c = config.chunk_tokens
    chunk_bytes = layout.chunk_bytes(c)
    ns = model_namespace(model, loaded.model_id, loaded.fingerprint)
    urls = config.tier_urls()
    disk_dir = Path(config.disk_dir).expanduser().resolve()
    made_dir = not disk_dir.exists()
    own_dirs = [
        disk_dir / ns.id.hex(),
        disk_dir / calibration_namespace(layout.dtype_name).id.hex(),
    ]
    if not config.reuse_disk:
        for d in own_dirs:
            shutil.rmtree(d, ignore_errors=True)

    progress("calibrating (or loading the profile)", step, steps)
    profile, info = obtain_profile(
        loaded,
        urls,
        c,
        path=config.profile_path,
        force=config.calibrate,
        plan=config.quick_plan,
        progress=lambda label: progress(label, step, steps),
    )
    step += 1
    paths = profile.paths()
    forward_step = c if config.exact else 0  # exact: chunk-aligned forwards, summed
    if config.refine:
        compute = RefinedCompute(profile.prefill, profile.decode, step=forward_step)
    else:
        compute = profile.stepped_compute(forward_step)
    policy = LoadOrRecompute(compute, layout.bytes_per_token, paths, c)

    tiers = []
    hints = ReuseHints()
    admissions: dict[str, HintedAdmission] = {}
    options = []
    try:
        for i, (url, name) in enumerate(urls):
            tier = open_tier(url, ns.id)
            tier.name = name
            tiers.append(tier)
            if i and config.admission:
                path = paths[name]
                adm = HintedAdmission(hints, 1.0 / path.read_bandwidth, path.latency_s)
                admissions[name] = adm
                options.append(TierOptions(admission=adm))
            else:
                options.append(TierOptions())
        cache = TieredCache(tiers, CacheConfig(chunk_tokens=c, tiers=tuple(options)))
        decider = LoggedDecision(policy, QueueProbe(cache, paths, chunk_bytes))
        with (
            HFEngine(
                model,
                cache,
                namespace=ns,
                chunk_tokens=c,
                decide=decider,
                chunk_value=hints.value_at,
                exact=config.exact,
            ) as kv,
            HFEngine(model, None, namespace=ns, chunk_tokens=c, exact=config.exact) as base,
        ):
            base.generate([1, 2, 3, 4, 5, 6, 7, 8], 2)  # warm-up: first-call costs stay out
            results, kvtier_s, base_s = _run_requests(
                config, loaded, kv, base, decider, hints, compute, paths, progress, step, steps
            )
            step += len(results)
            kv.flush(timeout=120)
        metrics = cache.metrics.as_dict()
        cache.close()
    finally:
        for tier in tiers:
            tier.close()
    progress("checking break-even", step, steps)
    evens = break_even(profile)
    checks = {}
    if config.check_break_even:
        checks = check_break_even(loaded, profile, urls, c, evens)
    step += 1
    progress("done", step, steps)
    if not (config.keep_disk or config.reuse_disk):
        for d in own_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if made_dir:
            _rmdir_empty(disk_dir)
    return RunReport(
        config=_config_dict(config),
        model={
            "model_id": loaded.model_id,
            "fingerprint": loaded.fingerprint,
            "dtype": layout.dtype_name,
            "device": str(model.device),
            "threads": torch.get_num_threads(),
            "layers": layout.layers,
            "kv_heads": layout.kv_heads,
            "head_dim": layout.head_dim,
            "kv_bytes_per_token": layout.bytes_per_token,
            "chunk_tokens": c,
            "chunk_bytes": chunk_bytes,
        },
        tiers=[{"name": name, "url": url} for url, name in urls],
        profile=_profile_dict(profile, info, compute),
        break_even={
            name: {"tokens": evens[name], "checks": checks.get(name, [])} for name in evens
        },
        requests=results,
        cache=metrics,
        admission={
            name: {"admitted": dict(a.admitted), "refused": dict(a.refused)}
            for name, a in admissions.items()
        },
        timing={
            "model_load_s": model_load_s,
            "profile_s": info.seconds,
            "kvtier_s": kvtier_s,
            "recompute_s": base_s,
            "wall_s": time.perf_counter() - began,
        },
        load_average=load_average(),
    )


def _run_requests(config, loaded, kv, base, decider, hints, compute, paths, progress, step, steps):
    spec = config.workload
    c = config.chunk_tokens
    tok = loaded.tokenizer

    def tokenize(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    sessions = build_sessions(spec)
    shared = [len(tokenize(s.preamble)) for s in sessions]
    turns = [s.prompts(tokenize) for s in sessions]
    first_path = next(iter(paths.values()))
    reload_chunk_s = first_path.seconds(kv.layout.chunk_bytes(c))
    results: list[RequestResult] = []
    kvtier_s = base_s = 0.0
    for index, (si, _) in enumerate(interleave(sessions)):
        session = sessions[si]
        turn, ids, pause = next(turns[si])
        progress(f"{session.name} turn {turn + 1}", step + index, steps)
        if pause and config.pauses:
            time.sleep(pause)  # the tool call: the cache keeps writing meanwhile
        keys = kv.keys(ids)
        hints.set(
            keys,
            chunk_values(
                session.kind, shared[si], len(keys), c, compute.prefill_seconds, reload_chunk_s
            ),
        )
        t0 = time.perf_counter()
        got = kv.generate(ids, spec.max_new_tokens)
        t1 = time.perf_counter()
        made = decider.take()
        kv.flush(timeout=120)
        t2 = time.perf_counter()
        ref = base.generate(ids, spec.max_new_tokens)
        base_s += time.perf_counter() - t2
        kvtier_s += t1 - t0
        entry = decision_entry(got.record, made, compute)
        judge(entry, got.record.ttft_s, ref.record.ttft_s)
        if isinstance(compute, RefinedCompute):  # what the engine measured, for the next ones
            for new, cached, seconds in got.record.forwards:
                compute.observe(new, cached, seconds)
        results.append(
            RequestResult(
                index=index,
                session=session.name,
                kind=session.kind,
                turn=turn,
                prompt_tokens=len(ids),
                shared_tokens=shared[si],
                tokens_match=got.tokens == ref.tokens,
                generated=len(got.tokens),
                kvtier=got.record.as_dict(),
                recompute=ref.record.as_dict(),
                decision=entry,
                store_flush_s=t2 - t1,
                logits_max_diff=float((got.logits.float() - ref.logits.float()).abs().max()),
            )
        )
        session.answer(got.tokens)
    return results, kvtier_s, base_s


def check_break_even(
    loaded,
    profile,
    tier_urls,
    chunk_tokens: int,
    evens: dict[str, int | None],
    max_recompute_s: float = 2.5,
) -> dict[str, list[dict]]:
    """Measure reload vs recompute at the chunk multiples around each tier's break-even.

    For a break-even of ``b`` tokens: at ``ceil(b / chunk)`` chunks the reload should win, at
    ``floor(b / chunk)`` chunks (when ≥ 1) the recompute. Reloads are timed on fresh tier
    instances in the calibration namespace (lookup + read + copy into the model's KV);
    recomputes are a plain prefill. Lengths whose predicted recompute exceeds
    ``max_recompute_s`` are skipped (this check is meant to be cheap).
    """
    import torch
    from transformers import DynamicCache

    from kvtier.engines.calibrate import CalibrationPlan, measure_device_copy, measure_tier_load
    from kvtier.engines.hf import forward_keywords
    from kvtier.engines.kv_layout import KVLayout
    from kvtier.tiers.registry import open_tier

    model = loaded.model
    layout = KVLayout.from_model(model)
    compute = profile.compute
    cache_kw, keep = forward_keywords(model)
    prefill_cache: dict[int, float] = {}

    def recompute(tokens: int) -> float:
        if tokens not in prefill_cache:
            gen = torch.Generator().manual_seed(tokens)
            vocab = int(model.config.get_text_config(decoder=True).vocab_size)
            ids = torch.randint(0, vocab, (1, tokens), generator=gen).to(model.device)
            best = float("inf")
            with torch.inference_mode():
                for _ in range(2):
                    kw = {cache_kw: DynamicCache(config=model.config), "use_cache": True}
                    if keep:
                        kw["logits_to_keep"] = 1
                    start = time.perf_counter()
                    model(ids, **kw)
                    best = min(best, time.perf_counter() - start)
            prefill_cache[tokens] = best
        return prefill_cache[tokens]

    ns = calibration_namespace(layout.dtype_name)
    out: dict[str, list[dict]] = {}
    for url, name in tier_urls:
        even = evens.get(name)
        lengths = []
        if even is not None:
            lo, hi = even // chunk_tokens, -(-even // chunk_tokens)
            lengths = sorted({k for k in (lo, hi) if k >= 1})
        lengths = [
            k for k in lengths if compute.prefill_seconds(k * chunk_tokens) <= max_recompute_s
        ]
        if not lengths:
            out[name] = []
            continue
        plan = CalibrationPlan(
            chunk_tokens=chunk_tokens, load_chunks=tuple(lengths), load_repeats=3
        )
        need = 2 * max(lengths) * (layout.chunk_bytes(chunk_tokens) + 8192)
        tier = open_tier(roomy(url, need), ns.id)
        try:
            samples, _, _ = measure_tier_load(tier, layout, plan)
        finally:
            tier.close()
        copies = dict(measure_device_copy(layout, plan, model.device))
        rows = []
        for k, (nbytes, load_s) in zip(lengths, samples, strict=True):
            tokens = k * chunk_tokens
            reload_s = load_s + copies.get(nbytes, 0.0)
            recompute_s = recompute(tokens)
            expect = even is not None and tokens >= even
            rows.append(
                {
                    "tokens": tokens,
                    "reload_s": reload_s,
                    "recompute_s": recompute_s,
                    "reload_wins": reload_s < recompute_s,
                    "model_says_reload_wins": expect,
                    "agrees": (reload_s < recompute_s) == expect,
                }
            )
        out[name] = rows
    return out


def _rmdir_empty(path: Path) -> None:
    try:
        path.rmdir()
        parent = path.parent
        if parent.name == ".kvtier":
            parent.rmdir()
    except OSError:
        pass


def _config_dict(config: RunConfig) -> dict:
    out = asdict(config)
    out["disk_dir"] = str(config.disk_dir)
    out["profile_path"] = str(config.profile_path) if config.profile_path else None
    out["reuse_priors"] = dict(REUSE_PRIORS)
    return out


def _profile_dict(profile, info: ProfileInfo, compute) -> dict:
    pre = profile.prefill
    tiers = {}
    for name, fit in profile.tiers.items():
        path = profile.path(name)
        tiers[name] = {
            "url": fit.url,
            "latency_s": fit.load.latency_s,
            "bandwidth": fit.load.bandwidth,
            "path_latency_s": path.latency_s,
            "path_bandwidth": path.bandwidth,
            "fit_error": fit.load.max_rel_error,
        }
    copy = profile.device_copy
    refined = None
    if isinstance(compute, RefinedCompute):
        fit = compute.fit
        refined = {
            "observed": compute.observed,
            "a": fit.a,
            "b": fit.b,
            "c": fit.c,
            "d": fit.d,
            "e": fit.e,
            "fit_error": fit.max_rel_error,
        }
    return {
        **info.as_dict(),
        "created": profile.created,
        "prefill": {
            "a": pre.a,
            "b": pre.b,
            "c": pre.c,
            "d": pre.d,
            "e": pre.e,
            "fit_error": pre.max_rel_error,
            "samples": [list(x) for x in pre.samples],
        },
        "refined": refined,
        "device_copy": None
        if copy is None
        else {"latency_s": copy.latency_s, "bandwidth": copy.bandwidth},
        "tiers": tiers,
    }
