"""``kvtier simulate``'s inputs turned into a simulation, and its sweeps.

:func:`build` reads the trace (or generates the workload), then builds the engine, kvtier's
tiers and the step timer — from ``kvtier plan``'s model and hardware flags, or from a
``kvtier run`` report's measurements — refusing bad input with one-line errors before
anything runs. :func:`run_sweep` runs it again for each value of one parameter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtier.cli.values import byte_size
from kvtier.errors import ConfigError
from kvtier.sim.config import ROUTINGS

SWEEPABLE = (
    "concurrency", "rate", "dram", "nvme", "link", "context", "preemption", "eviction",
    "replicas", "routing",
)  # fmt: skip
#: Swept parameters that change only the fleet, not the workload or the hardware: a sweep of
#: them builds the simulation once and changes its config.
FLEET = ("replicas", "routing")


@dataclass(frozen=True)
class SimArgs:
    """The command line's values (``kvtier simulate``'s options, whose defaults they take), then
    what a sweep sets besides: the host link's bandwidth and the prompts' scale."""

    model: str
    gpu: str
    gpus: int
    replicas: int
    dram: str
    nvme: str
    nvme_type: str
    shared: str
    link: str | None
    network: str
    codec_ratio: float
    codec_bandwidth: str | None
    kv_dtype: str | None
    weight_dtype: str | None
    mfu: float
    mbu: float
    reserve: str
    profile: Path | None
    calibration: Path | None
    concurrency_calibration: Path | None
    refine: bool | None
    trace: Path | None
    trace_format: str
    trace_block_tokens: int | None
    time_unit: float | None
    skip_bad: bool
    phase: str | None
    workload: str
    workload_file: Path | None
    sessions: int
    rate: float
    seed: int
    block_tokens: int | None
    chunk_tokens: int | None
    max_batched_tokens: int | None
    max_seqs: int
    pool_blocks: int
    concurrency: int | None
    routing: str
    kvtier: bool
    preemption: str
    preload: bool
    decide: bool
    eviction: str
    slo_ttft: float
    slo_tpot: float
    link_bandwidth: float | None = None
    context_scale: float = 1.0


@dataclass
class Built:
    """A simulation ready to run, with what describes it in reports."""

    args: SimArgs
    config: Any
    requests: list
    source: dict[str, Any] = field(default_factory=dict)
    calibration: Any = None

    def describe(self) -> dict[str, Any]:
        """The inputs, for ``--json``."""
        c = self.config
        out: dict[str, Any] = {
            "source": self.source,
            "engine": c.engine.__dict__,
            "timer": c.timer.to_dict(),
            "frontend": None if c.frontend is None else c.frontend.__dict__,
            "replicas": c.replicas,
            "routing": c.routing,
            "concurrency": c.concurrency,
            "kvtier": None,
        }
        if c.kvtier is not None:
            kv = c.kvtier
            out["kvtier"] = {
                "chunk_tokens": kv.chunk_tokens,
                "tiers": [t.to_dict() for t in kv.tiers],
                "preload": kv.preload,
                "decide": kv.decide,
                "host_link_bandwidth": kv.host_link_bandwidth,
            }
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_dict()
        return out


@dataclass(frozen=True)
class SweepSpec:
    """One parameter and the values a sweep gives it."""

    name: str
    values: tuple[str, ...]


def parse_sweep(text: str) -> SweepSpec:
    """``NAME=V1,V2,…`` (NAME among :data:`SWEEPABLE`)."""
    name, sep, values = str(text).partition("=")
    name = name.strip().replace("_", "-")
    if not sep or not values.strip():
        raise ConfigError(f"--sweep: write NAME=V1,V2,… (e.g. concurrency=1,4,16), not {text!r}")
    if name not in SWEEPABLE:
        raise ConfigError(f"--sweep: cannot sweep {name!r}; choose one of {', '.join(SWEEPABLE)}")
    items = tuple(v.strip() for v in values.split(",") if v.strip())
    if not items:
        raise ConfigError("--sweep: give at least one value")
    return SweepSpec(name, items)


def parse_sweeps(texts: list[str]) -> tuple[SweepSpec, ...]:
    """One ``--sweep`` (a table and a plot against its values) or two (the second one's values
    as series: ``--sweep replicas=4,16 --sweep routing=session,prefix`` draws each routing
    against the replicas)."""
    specs = tuple(parse_sweep(t) for t in texts)
    if len(specs) > 2:
        raise ConfigError("--sweep: give one parameter, or two (the second drawn as series)")
    if len(specs) == 2 and specs[0].name == specs[1].name:
        raise ConfigError(f"--sweep: {specs[0].name!r} is swept twice")
    return specs


def _check(a: SimArgs) -> None:
    if a.gpus < 1 or a.replicas < 1:
        raise ConfigError("--gpus and --replicas must be at least 1")
    if a.sessions < 1:
        raise ConfigError("--sessions must be at least 1")
    if not a.rate > 0:
        raise ConfigError(f"--rate must be positive, got {a.rate}")
    if a.concurrency is not None and a.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    if a.preemption not in ("recompute", "offload", "auto"):
        raise ConfigError(f"--preemption is recompute, offload or auto, not {a.preemption!r}")
    if a.routing not in ROUTINGS:
        raise ConfigError(f"--routing is one of {', '.join(ROUTINGS)}, not {a.routing!r}")
    if a.workload not in ("mix", "unique", "longctx"):
        raise ConfigError(f"--workload is mix, unique or longctx, not {a.workload!r}")
    if a.workload_file is not None and a.workload != "longctx":
        raise ConfigError("--workload-file describes the longctx workload: add --workload longctx")
    if a.codec_ratio <= 0:
        raise ConfigError("--codec-ratio must be positive")
    if a.max_seqs < 1 or (a.max_batched_tokens is not None and a.max_batched_tokens < 1):
        raise ConfigError("--max-seqs and --max-batched-tokens must be at least 1")
    for name in ("block_tokens", "chunk_tokens"):
        value = getattr(a, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if a.slo_ttft <= 0 or a.slo_tpot <= 0:
        raise ConfigError("the SLO's TTFT and TPOT must be positive")
    if a.calibration is not None and not a.calibration.is_file():
        raise ConfigError(f"--calibration: {a.calibration} is not a readable file")
    extra = a.concurrency_calibration
    if extra is not None and (a.calibration is None or not extra.is_file()):
        raise ConfigError(
            f"--concurrency-calibration: {extra} must be a readable run report, given with "
            "--calibration"
        )


def _requests(a: SimArgs):
    """(requests, source description, run metadata or None)."""
    from kvtier.workloads.traces import read_trace

    if a.trace is not None:
        trace = read_trace(
            a.trace,
            a.trace_format,
            block_tokens=a.trace_block_tokens,
            time_unit_s=a.time_unit,
            skip_bad=a.skip_bad,
            system=a.phase,
        )
        if not trace.requests:
            raise ConfigError(f"{a.trace}: the trace holds no request")
        source = {
            "trace": str(a.trace),
            "format": a.trace_format,
            "requests": len(trace.requests),
            "skipped_lines": trace.skipped,
        }
        return trace.requests, source, trace.run
    if a.workload == "longctx":
        from kvtier.workloads.longctx import LongContextSpec
        from kvtier.workloads.longctx_trace import longctx_requests

        spec = LongContextSpec.from_file(a.workload_file) if a.workload_file else LongContextSpec()
        spec = replace(spec, seed=a.seed)
        reqs = longctx_requests(spec, block_tokens=a.block_tokens or 128)
        return reqs, {"workload": "longctx", "requests": len(reqs), "seed": a.seed}, None
    if a.workload == "unique":
        from kvtier.workloads.arrivals import poisson
        from kvtier.workloads.synthetic import unique_prompts

        arrivals = poisson(a.rate, a.sessions, a.seed)
        reqs = unique_prompts(arrivals, (2048, 16384), 256, seed=a.seed)
        return reqs, {"workload": "unique", "requests": len(reqs), "seed": a.seed}, None
    from kvtier.workloads.synthetic import MixSpec, mix_requests

    reqs = mix_requests(MixSpec(seed=a.seed, sessions=a.sessions, rate_per_s=a.rate))
    return reqs, {"workload": "mix", "sessions": a.sessions, "requests": len(reqs)}, None


def _scaled(requests: list, factor: float) -> list:
    """Prompts ``factor`` times as long (the shared prefix blocks repeat, extra ones are own)."""
    if factor == 1.0:
        return requests
    if not factor > 0:
        raise ConfigError(f"a context scale must be positive, got {factor}")
    out = []
    for r in requests:
        tokens = max(1, round(r.input_tokens * factor))
        keep = min(len(r.blocks), -(-tokens // r.block_tokens))
        out.append(replace(r, input_tokens=tokens, blocks=r.blocks[:keep]))
    return out


def build(a: SimArgs) -> Built:
    """The simulation the arguments describe (ConfigError/SpecError on bad input)."""
    _check(a)
    if a.preemption == "auto":
        a = replace(a, preemption="offload" if a.kvtier else "recompute")
    requests, source, run = _requests(a)
    requests = _scaled(requests, a.context_scale)
    if a.calibration is not None:
        return _from_calibration(a, requests, source, run)
    return _from_specs(a, requests, source)


def _trace_block(requests: list) -> int:
    return requests[0].block_tokens if requests else 16


def _from_specs(a: SimArgs, requests: list, source: dict) -> Built:
    from kvtier.cli.hardware import read_hardware, spill_tiers
    from kvtier.plan.inputs import parse_reserve
    from kvtier.sim.config import SimConfig
    from kvtier.sim.specs import (
        GPU_BATCHED_TOKENS,
        engine_from_specs,
        kvtier_from_specs,
        timer_from_specs,
    )

    hardware = read_hardware(a.profile, a.model, a.kv_dtype, a.weight_dtype, a.gpu, a.link)
    spec, device, host = hardware.model, hardware.gpu, hardware.link
    if a.link_bandwidth:
        host = replace(
            host,
            achieved_bandwidth=a.link_bandwidth,
            nameplate_bandwidth=max(a.link_bandwidth, host.nameplate_bandwidth),
        )
    fraction, reserve_bytes = parse_reserve(a.reserve)
    block = a.block_tokens or (_trace_block(requests) if a.trace is not None else 16)
    budget = a.max_batched_tokens or max(GPU_BATCHED_TOKENS, block)
    engine = engine_from_specs(
        spec,
        device,
        a.gpus,
        block_tokens=block,
        max_batched_tokens=budget,
        max_seqs=a.max_seqs,
        reserve_fraction=fraction,
        reserve_bytes=reserve_bytes,
        preemption=a.preemption,
    )
    timer = timer_from_specs(spec, device, a.gpus, mfu=a.mfu, mbu=a.mbu, budget=budget)
    decode_bw = byte_size(a.codec_bandwidth, "--codec-bandwidth") if a.codec_bandwidth else None
    choices = spill_tiers(hardware, a.dram, a.nvme, a.nvme_type, a.shared, a.codec_ratio, decode_bw)
    kv = None
    if a.kvtier and choices:
        chunk = a.chunk_tokens or max(256, block)
        if chunk % block:
            raise ConfigError(
                f"--chunk-tokens {chunk} must be a multiple of the {block}-token block"
            )
        kv = kvtier_from_specs(
            choices,
            host,
            a.gpus,
            model=spec,
            chunk_tokens=chunk,
            preload=a.preload,
            decide=a.decide,
        )
        kv = replace(kv, tiers=tuple(replace(t, eviction=a.eviction) for t in kv.tiers))
    elif a.preemption == "offload":
        raise ConfigError("--preemption offload needs kvtier's tiers (not --no-kvtier)")
    config = SimConfig(
        engine=engine,
        timer=timer,
        kvtier=kv,
        replicas=a.replicas,
        routing=a.routing,  # type: ignore[arg-type]
        network_bandwidth=byte_size(a.network, "--network"),
        concurrency=a.concurrency,
        slo_ttft_s=a.slo_ttft,
        slo_tpot_s=a.slo_tpot,
        seed=a.seed,
    )
    source = {**source, "model": spec.name, "gpu": device.name, "gpus": a.gpus, "link": host.name}
    return Built(a, config, requests, source)


def _from_calibration(a: SimArgs, requests: list, source: dict, run) -> Built:
    from kvtier.sim.config import SimConfig
    from kvtier.sim.measured import calibrate_from_report, refine_by_replay
    from kvtier.workloads.traces import read_trace

    try:
        report = json.loads(a.calibration.read_text())  # type: ignore[union-attr]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--calibration: cannot read {a.calibration}: {exc}") from None
    if isinstance(report, dict) and "prefill" in report and "phases" not in report:
        from kvtier.sim.measured import calibrate_from_profile

        pool = run.pool_blocks if run is not None else a.pool_blocks
        cal = calibrate_from_profile(report, pool)
    else:
        cal = calibrate_from_report(report)
    refine = a.refine if a.refine is not None else cal.fits.get("timer") == "warm-up"
    if refine and "phases" in report:
        phases = {}
        for phase in report.get("phases") or []:
            system = str(phase.get("system"))
            phases[system] = read_trace(a.calibration, "kvtier-run", system=system).requests
        concurrency = int((report.get("config") or {}).get("concurrency") or 1)
        cal = refine_by_replay(cal, phases, concurrency)
    if a.concurrency_calibration is not None:
        cal = _fit_contention(cal, a.concurrency_calibration)
    engine = replace(cal.engine, preemption=a.preemption, max_seqs=a.max_seqs)  # type: ignore[arg-type]
    if run is not None:  # a replayed run brings its own serving set-up: its pool, its length
        from kvtier.sim.measured import VLLM_NULL_BLOCKS

        engine = replace(
            engine,
            pool_blocks=run.pool_blocks - VLLM_NULL_BLOCKS,
            max_model_len=run.max_model_len,
        )
    if a.max_batched_tokens:
        engine = replace(engine, max_batched_tokens=a.max_batched_tokens)
    if a.block_tokens:
        engine = replace(engine, block_tokens=a.block_tokens)
    kv = None
    if a.kvtier:
        kv = cal.kvtier(preload=a.preload, decide=a.decide)
        kv = replace(kv, tiers=tuple(replace(t, eviction=a.eviction) for t in kv.tiers))
    elif a.preemption == "offload":
        raise ConfigError("--preemption offload needs kvtier's tiers (not --no-kvtier)")
    concurrency = a.concurrency
    if concurrency is None and run is not None:
        concurrency = run.concurrency
    config = SimConfig(
        engine=engine,
        timer=cal.timer,
        kvtier=kv,
        replicas=a.replicas,
        routing=a.routing,  # type: ignore[arg-type]
        concurrency=concurrency,
        slo_ttft_s=a.slo_ttft,
        slo_tpot_s=a.slo_tpot,
        seed=a.seed,
        frontend=cal.frontend,
    )
    source = {**source, "calibration": str(a.calibration)}
    return Built(a, config, requests, source, cal)


def _fit_contention(cal, path: Path):
    from kvtier.sim.measured import fit_contention
    from kvtier.workloads.traces import read_trace

    try:
        report = json.loads(path.read_text())
        systems = [str(p.get("system")) for p in report["phases"]]
        concurrency = int(report["config"]["concurrency"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"--concurrency-calibration: {path} is not a run report ({exc})"
        ) from None
    if concurrency < 2:
        raise ConfigError(
            f"--concurrency-calibration: {path} ran one request at a time; give a run at "
            "--concurrency 2 or more"
        )
    phases = {s: read_trace(path, "kvtier-run", system=s).requests for s in systems}
    return fit_contention(cal, [(phases, concurrency)])


def _number(kind: type, name: str, value: str):
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"--sweep {name}: {value!r} is not a number") from None


def _with(a: SimArgs, name: str, value: str) -> SimArgs:
    if name == "concurrency":
        return replace(a, concurrency=_number(int, name, value))
    if name == "replicas":
        return replace(a, replicas=_number(int, name, value))
    if name == "routing":
        if value not in ROUTINGS:
            raise ConfigError(f"--sweep routing: one of {', '.join(ROUTINGS)}, not {value!r}")
        return replace(a, routing=value)
    if name == "rate":
        return replace(a, rate=_number(float, name, value))
    if name in ("dram", "nvme"):
        return replace(a, **{name: value})
    if name == "link":
        return replace(a, link_bandwidth=byte_size(value, "--sweep link"))
    if name == "context":
        return replace(a, context_scale=_number(float, name, value))
    if name == "preemption":
        return replace(a, preemption=value)
    if name == "eviction":
        return replace(a, eviction=value)
    raise ConfigError(f"--sweep: cannot sweep {name!r}")


def sweep_row(point: dict[str, str], result) -> dict[str, Any]:
    """One sweep point's figures (a table row and a plot point): the swept values ``point``
    (name → value), then what the run gave."""
    s = result.summary
    gpu = s["gpu_time"]
    links = s["links"]
    busiest = max(links.items(), key=lambda kv: kv[1]["utilization"], default=(None, None))
    peak = max((r["peak_running"] for r in s["replicas"]), default=0)
    return {
        **point,
        "requests": s["finished"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p95_s": s["ttft_s"]["p95"],
        "tpot_p50_s": s["tpot_s"]["p50"],
        "load_wait_p95_s": s["load_wait_s"]["p95"],
        "throughput_tok_s": s["throughput"]["output_tokens_per_s"],
        "goodput_share": s["goodput"]["share"],
        "compute_share": gpu["compute_share"],
        "kv_wait_share": gpu["kv_wait_share"],
        "idle_share": gpu["idle_share"],
        "preemptions": s["preemptions"],
        "hit_rate": s["hit_rate"],
        "hit_share": sum(s["hit_rate"].values()),
        "peak_running": peak,
        "busiest_link": busiest[0],
        "busiest_link_utilization": busiest[1]["utilization"] if busiest[1] else None,
    }


def sweep_points(specs: Sequence[SweepSpec]) -> list[dict[str, str]]:
    """Every combination of the swept values, the first parameter's outermost."""
    points: list[dict[str, str]] = [{}]
    for spec in specs:
        points = [{**p, spec.name: v} for p in points for v in spec.values]
    return points


def _point(built: Built, point: dict[str, str], cache: dict[tuple, Built]) -> Built:
    """The simulation of one sweep point: built again where a swept value changes the workload
    or the hardware, else ``built``'s with the fleet's values in its config."""
    args = built.args
    for name, value in point.items():
        args = _with(args, name, value)
    rebuilt = tuple((n, v) for n, v in point.items() if n not in FLEET)
    base = cache.get(rebuilt)
    if base is None:
        base = cache[rebuilt] = build(args) if rebuilt else built
    _check(args)
    fleet = {"replicas": args.replicas, "routing": args.routing}
    return Built(args, replace(base.config, **fleet), base.requests, base.source, base.calibration)


def run_sweep(
    built: Built,
    specs: SweepSpec | Sequence[SweepSpec],
    progress: Callable[[str, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the simulation once per value of the swept parameter (per combination of the two
    parameters' values); one row each, every point checked before the first runs."""
    from kvtier.sim.simulator import simulate

    specs = (specs,) if isinstance(specs, SweepSpec) else tuple(specs)
    points = sweep_points(specs)
    cache: dict[tuple, Built] = {}
    runs = [_point(built, p, cache) for p in points]
    rows = []
    for i, (point, b) in enumerate(zip(points, runs, strict=True)):
        if progress is not None:
            label = ", ".join(f"{n}={v}" for n, v in point.items())
            progress(label, i, len(runs))
        rows.append(sweep_row(point, simulate(b.config, b.requests)))
    if progress is not None:
        progress("done", len(runs), len(runs))
    return rows


__all__ = [
    "FLEET",
    "SWEEPABLE",
    "Built",
    "SimArgs",
    "SweepSpec",
    "build",
    "parse_sweep",
    "parse_sweeps",
    "run_sweep",
    "sweep_points",
    "sweep_row",
]


def _measured_percentiles(requests: list, name: str) -> dict[str, float | None]:
    from kvtier.sim.results import percentiles

    return percentiles([float(r.measured[name]) for r in requests if r.measured.get(name)])


def compare_with_run(a: SimArgs) -> dict[str, Any]:
    """Replay every phase of a ``kvtier run`` report and set the simulated figures beside the
    measured ones: TTFT and end-to-end p50/p95 and vLLM's preemption counter, per phase
    (``vllm`` without kvtier's tiers, the others with them)."""
    from kvtier.sim.replays import replay
    from kvtier.workloads.traces import read_trace

    if a.trace is None or a.trace_format != "kvtier-run":
        raise ConfigError("--compare replays a kvtier run report: give --trace-format kvtier-run")
    try:
        report = json.loads(Path(a.trace).read_text())
        systems = [str(p.get("system")) for p in report.get("phases") or []]
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{a.trace}: not a kvtier run report ({exc})") from None
    if not systems:
        raise ConfigError(f"{a.trace}: the run report has no phases")
    phases = []
    calibration = None
    for system in systems:
        run_args = replace(a, phase=system, kvtier="kvtier" in system)
        built = build(run_args)
        calibration = calibration or built.calibration
        run = read_trace(a.trace, "kvtier-run", system=system).run
        pooled = replay(built.config, built.requests)
        measured_preempt = None
        if run is not None:
            measured_preempt = sum(
                v for k, v in run.metrics.items() if k.startswith("vllm:num_preemptions")
            )
        row: dict[str, Any] = {"system": system, "requests": len(built.requests)}
        for name in ("ttft_s", "e2e_s"):
            want = _measured_percentiles(built.requests, name)
            got = getattr(pooled, name)
            row[name] = {
                "measured": {k: want[k] for k in ("p50", "p95")},
                "simulated": {k: got[k] for k in ("p50", "p95")},
                "error": {
                    k: (got[k] / want[k] - 1) if want[k] and got[k] is not None else None
                    for k in ("p50", "p95")
                },
            }
        row["preemptions"] = {
            "measured": measured_preempt,
            "simulated": pooled.preemptions,
        }
        row["hit_tokens"] = {
            "measured": _measured_hits(built.requests),
            "simulated": pooled.first.summary["hit_tokens"],
        }
        row["replays"] = pooled.replays
        phases.append(row)
    return {
        "trace": str(a.trace),
        "calibration": str(a.calibration) if a.calibration else None,
        "timer": calibration.timer.to_dict() if calibration is not None else None,
        "frontend": (
            calibration.frontend.__dict__
            if calibration is not None and calibration.frontend is not None
            else None
        ),
        "phases": phases,
    }


def _measured_hits(requests: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        for tier, n in (r.measured.get("hit_tokens") or {}).items():
            out[str(tier)] = out.get(str(tier), 0) + int(n)
    return out
