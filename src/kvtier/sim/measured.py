"""A simulation calibrated from what a ``kvtier run --engine vllm`` report measured.

The report of another run (another seed) gives the engine's speed and kvtier's load speeds:

- the step timer (:class:`~kvtier.sim.timing.MeasuredTimer`): one decode step's seconds is a
  step's fixed cost; the warm-up's cold prompts (seconds to first token at a few lengths) are
  fitted, step by step as the engine chunks them, to a request's fixed cost outside the
  steps, a cost per token and a causal-attention cost (non-negative least squares on
  relative error);
- each tier's read speed: ``latency + bytes / bandwidth`` fitted to the connector's records of
  synchronous loads (bytes loaded, seconds the step waited) per tier; a tier without records
  keeps the given defaults;
- the engine: its pool, block size, token budget and KV bytes per token; kvtier's chunk size
  and tier sizes.

Nothing from the run being judged is used: it is replayed, not fitted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvtier.cost.calibration import CalibrationError, fit_transfer, nnls_relative
from kvtier.errors import ConfigError
from kvtier.sim.config import EngineSpec, FrontendSpec, KvtierSpec, SimConfig
from kvtier.sim.tiers import TierSpec
from kvtier.sim.timing import VLLM_CPU_BATCHED_TOKENS, MeasuredTimer
from kvtier.workloads.requests import TraceRequest

#: vLLM's block on this CPU backend.
VLLM_CPU_BLOCK_TOKENS = 128
#: Blocks of vLLM's pool no request can use (its block pool keeps one "null" block).
VLLM_NULL_BLOCKS = 1
#: Read speeds of the connector's tiers when a report has no loads to fit them from
#: (bytes/s, seconds): a tmpfs slab copied by one thread, an O_DIRECT slab on local disk.
DEFAULT_READ = {"dram": (1.0e9, 2e-3), "disk": (0.8e9, 5e-3)}
DEFAULT_WRITE = {"dram": 2.0e9, "disk": 0.8e9}


@dataclass(frozen=True)
class RunCalibration:
    """What a report's measurements give a simulation (see the module docs)."""

    timer: Any
    engine: EngineSpec
    tiers: tuple[TierSpec, ...]
    chunk_tokens: int
    fits: dict[str, Any] = field(default_factory=dict)
    frontend: FrontendSpec | None = None
    connector_costs: dict[str, float] = field(default_factory=dict)

    def config(self, kvtier: bool, concurrency: int | None, **options: Any) -> SimConfig:
        """A simulation of the measured engine, with kvtier's tiers or without."""
        kv = self.kvtier() if kvtier else None
        return SimConfig(
            engine=self.engine,
            timer=self.timer,
            kvtier=kv,
            concurrency=concurrency,
            frontend=self.frontend,
            **options,
        )

    def kvtier(self, **options: Any) -> KvtierSpec:
        """kvtier's connector over the report's tiers (``options`` override the defaults)."""
        costs = dict(self.connector_costs)
        costs.update(options)
        return KvtierSpec(tiers=self.tiers, chunk_tokens=self.chunk_tokens, **costs)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "timer": self.timer.to_dict(),
            "pool_blocks": self.engine.pool_blocks,
            "block_tokens": self.engine.block_tokens,
            "max_batched_tokens": self.engine.max_batched_tokens,
            "kv_bytes_per_token": self.engine.kv_bytes_per_token,
            "chunk_tokens": self.chunk_tokens,
            "tiers": [t.to_dict() for t in self.tiers],
            "frontend": None if self.frontend is None else self.frontend.__dict__,
            "fits": self.fits,
        }


def fit_timer(
    engine: Mapping[str, Any],
    budget: int = VLLM_CPU_BATCHED_TOKENS,
    request_overhead_s: float = 0.0,
) -> MeasuredTimer:
    """The step timer from a report's ``engine`` section (see the module docs): with the
    request's cost outside the engine given, the warm-up's cold prompts fit a cost per prefill
    chunk, per token and per attention pair."""
    try:
        points = [(int(n), float(s)) for n, s in engine["prefill"]["points"]]
        step = float(engine["decode_step_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the report's engine speed lacks {exc}") from None
    if len({n for n, _ in points}) < 2 or step <= 0:
        raise ConfigError("the report's engine speed needs cold prompts at two lengths or more")
    rows, secs = [], []
    for n, s in points:
        steps = -(-n // budget)
        tokens = float(n)
        attention = 0.0
        done = 0
        while done < n:
            k = min(budget, n - done)
            attention += k * (done + k / 2)
            done += k
        rows.append([float(steps), tokens, attention])
        secs.append(max(s - steps * step - request_overhead_s, 1e-6))
    try:
        (chunk_s, per_token, attention_s), _ = nnls_relative(np.array(rows), np.array(secs))
    except CalibrationError as exc:
        raise ConfigError(f"cannot fit the engine's prefill: {exc}") from None
    return MeasuredTimer(
        step_s=step,
        token_s=max(float(per_token), 1e-9),
        attention_s=float(attention_s),
        request_overhead_s=float(request_overhead_s),
        budget=budget,
        chunk_s=float(chunk_s),
    )


def isolated_requests(phase: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The requests of a phase that had the engine to themselves: no other request was in
    flight between their send and their last token."""
    reqs = [
        r
        for r in phase.get("requests") or []
        if r.get("sent_s") is not None and r.get("e2e_s") and r.get("server")
    ]
    spans = sorted((float(r["sent_s"]), float(r["sent_s"]) + float(r["e2e_s"])) for r in reqs)
    out = []
    for r in reqs:
        start = float(r["sent_s"])
        end = start + float(r["e2e_s"])
        overlapping = sum(1 for s0, s1 in spans if s0 < end and s1 > start)
        if overlapping == 1:
            out.append(r)
    return out


def fit_isolated(
    report: Mapping[str, Any], budget: int = VLLM_CPU_BATCHED_TOKENS
) -> MeasuredTimer | None:
    """The step timer from the engine-alone phase's requests that ran alone (None with fewer
    than six): the server's own time to first token of each (its prefill, chunked as the
    engine chunks it) fits a cost per chunk, per token and per attention pair; its mean time
    between tokens at its context fits a decode step's fixed cost and its cost per context
    token; what the client waited beyond the server is the request's cost outside."""
    phases = [p for p in report.get("phases") or [] if p.get("system") == "vllm"]
    if not phases:
        return None
    alone = isolated_requests(phases[0])
    if len(alone) < 6:
        return None
    rows, secs, drows, dsecs = [], [], [], []
    for r in alone:
        server = r["server"]
        cached = int(r.get("cached_tokens") or 0)
        new = int(r["prompt_tokens"]) - cached
        if new < 1:
            continue
        steps, attention, done = 0, 0.0, 0
        while done < new:
            k = min(budget, new - done)
            attention += k * (cached + done + k / 2)
            done += k
            steps += 1
        rows.append([float(steps), float(new), attention])
        secs.append(float(server["time_to_first_token_ms"]) / 1e3)
        if int(r.get("output_tokens") or 0) > 1 and server.get("mean_itl_ms"):
            context = int(r["prompt_tokens"]) + int(r["output_tokens"]) / 2
            drows.append([1.0, context])
            dsecs.append(float(server["mean_itl_ms"]) / 1e3)
    if len(rows) < 6 or len(drows) < 3:
        return None
    try:
        (step, context_s), _ = nnls_relative(np.array(drows), np.array(dsecs))
        secs_net = np.maximum(np.array(secs) - step, 1e-6)
        (chunk, token, attention_s), _ = nnls_relative(np.array(rows), secs_net)
    except CalibrationError:
        return None
    return MeasuredTimer(
        step_s=float(step),
        token_s=max(float(token), 1e-9),
        attention_s=float(attention_s),
        context_s=float(context_s),
        request_overhead_s=outside_engine_s(report),
        budget=budget,
        chunk_s=float(chunk),
    )


def fit_connector_costs(
    report: Mapping[str, Any], timer: MeasuredTimer, budget: int = VLLM_CPU_BATCHED_TOKENS
) -> dict[str, float]:
    """What kvtier's connector adds to the engine's steps, from the kvtier phase's requests
    that ran alone: their server time to first token, less what ``timer`` says the prefill
    takes and less the connector's own measured wait for loads, fits a cost per prefilled token
    and per request (empty with fewer than six such requests)."""
    phases = [p for p in report.get("phases") or [] if p.get("system") != "vllm"]
    if not phases:
        return {}
    rows, secs = [], []
    for r in isolated_requests(phases[0]):
        line = r.get("connector") or {}
        cached = int(line.get("local_hit_tokens") or 0) + int(line.get("loaded_tokens") or 0)
        new = int(r["prompt_tokens"]) - cached
        if new < 1:
            continue
        server = float(r["server"]["time_to_first_token_ms"]) / 1e3
        rest = server - timer.prefill_seconds(new, cached)  # its steps' fixed costs included
        rest -= float(line.get("load_wait_s") or 0.0)
        rows.append([float(new), 1.0])
        secs.append(rest)
    if len(rows) < 6:
        return {}
    design, target = np.array(rows), np.array(secs)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    token, request = (max(float(c), 0.0) for c in coef)
    return {"token_cost_s": token, "request_cost_s": request}


def fit_jitter(report: Mapping[str, Any], timer: MeasuredTimer) -> float:
    """How much the engine's step times varied in a report: σ of their logarithm, robustly
    (the median absolute deviation × 1.4826), from the server's own time to first token of
    each engine-alone request that ran alone against what ``timer`` says its prefill takes
    (0 with fewer than six such requests)."""
    phases = [p for p in report.get("phases") or [] if p.get("system") == "vllm"]
    logs = []
    for r in isolated_requests(phases[0]) if phases else []:
        cached = int(r.get("cached_tokens") or 0)
        new = int(r["prompt_tokens"]) - cached
        predicted = timer.prefill_seconds(new, cached) if new > 0 else 0.0
        measured = float(r["server"]["time_to_first_token_ms"]) / 1e3
        if predicted > 0 and measured > 0:
            logs.append(math.log(measured / predicted))
    if len(logs) < 6:
        return 0.0
    x = np.array(logs)
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def outside_engine_s(report: Mapping[str, Any]) -> float:
    """What a client waits for its first token beyond the server's own time to first token
    when the engine had nothing else to finish first: the 10th percentile of that gap over
    every request of the report (the engine adds a request only between steps, so the gap's
    upper part is waiting for a step to end, which the simulation itself plays)."""
    gaps = []
    for phase in report.get("phases") or []:
        for req in phase.get("requests") or []:
            server = req.get("server") or {}
            inside = server.get("time_to_first_token_ms")
            if inside is not None and req.get("ttft_s") is not None:
                gaps.append(float(req["ttft_s"]) - float(inside) / 1e3)
    return max(float(np.percentile(gaps, 10)), 0.0) if gaps else 0.0


def load_samples(report: Mapping[str, Any], kv_bytes_per_token: float) -> dict[str, list]:
    """(bytes, seconds) of the synchronous loads per tier, from the kvtier phase's records."""
    out: dict[str, list[tuple[int, float]]] = {}
    for phase in report.get("phases") or []:
        if phase.get("system") == "vllm":
            continue
        for req in phase.get("requests") or []:
            line = req.get("connector") or {}
            hits = line.get("hit_tokens") or {}
            wait = line.get("load_wait_s")
            if not line.get("sync") or not hits or not wait or len(hits) != 1:
                continue
            ((tier, tokens),) = hits.items()
            out.setdefault(str(tier), []).append((int(tokens * kv_bytes_per_token), float(wait)))
    return out


def calibrate_from_profile(
    data: Mapping[str, Any], pool_blocks: int, block_tokens: int = VLLM_CPU_BLOCK_TOKENS
) -> RunCalibration:
    """A :class:`RunCalibration` from a ``kvtier calibrate`` profile (its JSON): the profile's
    prefill and decode fits time the steps, its tiers' load fits give their read speeds (the
    device copy in series), and the engine holds ``pool_blocks`` blocks of its model's KV."""
    from kvtier.cost.calibration import CalibrationProfile
    from kvtier.sim.timing import ProfileTimer

    try:
        profile = CalibrationProfile.from_dict(dict(data))
    except (KeyError, TypeError, ValueError, CalibrationError) as exc:
        raise ConfigError(f"not a kvtier calibrate profile: {exc}") from None
    model = profile.model
    timer = ProfileTimer(profile.prefill, profile.decode)
    engine = EngineSpec(
        pool_blocks=pool_blocks,
        block_tokens=block_tokens,
        kv_bytes_per_token=float(model.kv_bytes_per_token),
        max_batched_tokens=VLLM_CPU_BATCHED_TOKENS,
    )
    tiers = []
    for name, fit in profile.tiers.items():
        path = profile.path(name)
        tiers.append(
            TierSpec(
                name=name,
                read_bandwidth=fit.load.bandwidth,
                write_bandwidth=DEFAULT_WRITE.get(name, DEFAULT_WRITE["disk"]),
                latency_s=fit.load.latency_s,
                codec_ratio=fit.codec_ratio,
                path=path,
            )
        )
    chunk = max(model.chunk_tokens, block_tokens)
    chunk -= chunk % block_tokens
    return RunCalibration(timer, engine, tuple(tiers), chunk, {"profile": profile.created})  # type: ignore[arg-type]


def calibrate_from_report(report: Mapping[str, Any]) -> RunCalibration:
    """A :class:`RunCalibration` from a ``kvtier run --engine vllm --json`` report."""
    try:
        config = report["config"]
        kv_per_token = float(report["model"]["kv_bytes_per_token"])
        engine_speed = report["engine"]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"not a kvtier run (vLLM) report: it lacks {exc}") from None
    timer = fit_isolated(report)
    source = "requests that ran alone"
    if timer is None:
        timer = fit_timer(engine_speed, request_overhead_s=outside_engine_s(report))
        source = "warm-up"
    engine = EngineSpec(
        pool_blocks=int(config["pool_blocks"]) - VLLM_NULL_BLOCKS,
        block_tokens=VLLM_CPU_BLOCK_TOKENS,
        kv_bytes_per_token=kv_per_token,
        max_batched_tokens=VLLM_CPU_BATCHED_TOKENS,
        max_model_len=int(config.get("max_model_len") or 0) or None,
    )
    chunk = int(config.get("chunk_tokens") or 256)
    tiers_info = report.get("tiers") or {}
    samples = load_samples(report, kv_per_token)
    fits: dict[str, Any] = {"samples": {k: len(v) for k, v in samples.items()}, "timer": source}
    tiers = []
    for i, info in enumerate(tiers_info.get("tiers") or []):
        name = str(info.get("name") or f"tier{i}")
        bandwidth, latency = DEFAULT_READ.get(name, DEFAULT_READ["disk"])
        found = samples.get(name, [])
        if len({b for b, _ in found}) >= 2:
            fit = fit_transfer(found)
            bandwidth, latency = fit.bandwidth, fit.latency_s
            fits[name] = {"bandwidth": bandwidth, "latency_s": latency, "samples": len(found)}
        tiers.append(
            TierSpec(
                name=name,
                read_bandwidth=bandwidth,
                write_bandwidth=DEFAULT_WRITE.get(name, DEFAULT_WRITE["disk"]),
                latency_s=latency,
                capacity_bytes=float(info.get("bytes") or 0) or None,
            )
        )
    costs = fit_connector_costs(report, timer)
    fits["connector_costs"] = costs
    jitter = fit_jitter(report, timer) if source != "warm-up" else 0.0
    fits["jitter"] = jitter
    frontend = FrontendSpec(jitter=jitter) if jitter > 0 else None
    return RunCalibration(
        timer, engine, tuple(tiers), chunk, fits, frontend=frontend, connector_costs=costs
    )


#: The timer's coefficients :func:`refine_by_replay` adjusts, and the frontend's.
REFINED = ("chunk_s", "token_s", "attention_s", "context_s", "seq_s")
FRONTEND = ("front_in_s", "front_out_s")
#: The frontend's speed while the engine steps: on a host of two cores whose forward keeps
#: both busy, the API server's thread gets about a third of them.
FRONTEND_SHARE = 0.33


def replay_error(
    cal: RunCalibration,
    phases: Mapping[str, Sequence[TraceRequest]],
    concurrency: int | None,
) -> float:
    """Mean squared log error of the replayed TTFT and end-to-end p50 and p95 against the
    measured ones, over every phase (``vllm``: the engine alone, else with kvtier)."""
    from kvtier.sim.replays import replay

    errors: list[float] = []
    for system, requests in phases.items():
        pooled = replay(cal.config(system != "vllm", concurrency), requests)
        for name in ("ttft_s", "e2e_s"):
            want = [float(r.measured[name]) for r in requests if r.measured.get(name)]
            if not want:
                continue
            measured = np.percentile(want, [50, 95])
            got = getattr(pooled, name)
            for q, m in zip(("p50", "p95"), measured, strict=True):
                if got[q] and m > 0:
                    errors.append(math.log(got[q] / m) ** 2)
    return float(np.mean(errors)) if errors else math.inf


def refine_by_replay(
    cal: RunCalibration,
    phases: Mapping[str, Sequence[TraceRequest]],
    concurrency: int | None,
    evaluations: int = 120,
) -> RunCalibration:
    """The calibration that replays a calibration run best.

    A Nelder–Mead search in log space (each coefficient ``v`` searched as ``log(v + floor)``,
    so zero stays reachable) over the timer's :data:`REFINED` coefficients and the frontend's
    work per request and per token (:data:`FRONTEND`), from the warm-up's fit, minimising the
    replay error (:func:`replay_error`) of the run's own requests within ``evaluations``
    replays (two searches, the second restarted from the first's best point with a smaller
    simplex). The run must be another than the one the simulation is judged on.
    """
    names = REFINED + FRONTEND
    floors = np.array([_FLOORS[name] for name in names])
    front = cal.frontend or FrontendSpec(share=FRONTEND_SHARE)
    start = [getattr(cal.timer, n) for n in REFINED] + [front.in_s, front.out_s]

    def at(x: np.ndarray) -> RunCalibration:
        v = np.maximum(np.exp(x) - floors, 0.0)
        timer = replace(cal.timer, **{n: float(v[i]) for i, n in enumerate(REFINED)})
        k = len(REFINED)
        frontend = replace(front, in_s=float(v[k]), out_s=float(v[k + 1]))
        return replace(cal, timer=timer, frontend=frontend)

    def error(x: np.ndarray) -> float:
        return replay_error(at(x), phases, concurrency)

    x0 = np.log(np.array(start, dtype=float) + floors)
    given = replace(cal, frontend=front)  # the start itself: x0 round-trips it only to rounding
    before = replay_error(given, phases, concurrency)
    best_x, best = None, before
    for step in (math.log(3.0), math.log(1.5)):  # a restart from the best point escapes stalls
        x, err = nelder_mead(error, x0 if best_x is None else best_x, step=step,
                             evaluations=evaluations // 2)  # fmt: skip
        if err < best:
            best_x, best = x, err
    out = given if best_x is None else at(best_x)
    fits = dict(cal.fits)
    fits["replay"] = {
        "error_before": before,
        "error_after": best,
        "timer": out.timer.to_dict(),
        "frontend": out.frontend.__dict__ if out.frontend else None,
    }
    return replace(out, fits=fits)


def fit_contention(
    cal: RunCalibration,
    runs: Sequence[tuple[Mapping[str, Sequence[TraceRequest]], int | None]],
    upper: float = 2.0,
    evaluations: int = 18,
) -> RunCalibration:
    """The calibration whose steps slow with the requests in flight as the calibration runs
    (``(phases, concurrency)`` each; at least one run with concurrency above one) say. First
    the frontend's ``contention`` on the engine-alone phases (every phase when there is
    none), then, with it fixed, what kvtier's connector changes in it on the other phases (its
    threads share the host's cores with the forward; it leaves less to compute): golden-section
    searches on the summed replay error in ``[0, upper]`` and ``[-contention, upper]``, each
    kept at zero where that does no worse. On a host whose few cores the engine shares with its
    API server and clients, what one request alone measured does not hold for four at once."""
    front = cal.frontend or FrontendSpec()
    engine_alone = [({"vllm": p["vllm"]}, c) for p, c in runs if "vllm" in p]
    with_kvtier = [({k: v for k, v in p.items() if k != "vllm"}, c) for p, c in runs]
    with_kvtier = [(p, c) for p, c in with_kvtier if p]

    def engine_error(g: float) -> float:
        trial = replace(cal, frontend=replace(front, contention=g))
        return sum(replay_error(trial, phases, c) for phases, c in engine_alone or runs)

    g, best, zero = _golden(engine_error, upper, evaluations)
    cal = replace(cal, frontend=replace(front, contention=g))
    fits = dict(cal.fits)
    fits["contention"] = {"value": g, "error": best, "error_without": zero}
    if engine_alone and with_kvtier:
        costs = dict(cal.connector_costs)

        def connector_error(k: float) -> float:
            trial = replace(cal, connector_costs={**costs, "contention": k})
            return sum(replay_error(trial, phases, c) for phases, c in with_kvtier)

        k, best, zero = _golden(connector_error, upper, evaluations, lower=-g)
        cal = replace(cal, connector_costs={**costs, "contention": k})
        fits["connector_contention"] = {"value": k, "error": best, "error_without": zero}
    return replace(cal, fits=fits)


def _golden(
    error, upper: float, evaluations: int, lower: float = 0.0
) -> tuple[float, float, float]:
    """(x, error(x), error(0)): a golden-section search of ``error`` in ``[lower, upper]``,
    zero where it does no worse."""
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = lower, upper
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = error(a), error(b)
    for _ in range(max(evaluations - 2, 0)):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = error(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = error(b)
    x, best = (a, fa) if fa < fb else (b, fb)
    zero = error(0.0)
    if zero <= best:
        x, best = 0.0, zero
    return x, best, zero


def nelder_mead(f, x0: np.ndarray, step: float, evaluations: int) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` (a simplex of side ``step``) within ``evaluations`` calls: the
    standard reflect / expand / contract / shrink moves."""
    n = len(x0)
    simplex = [x0.copy()] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    calls = n + 1
    while calls < evaluations:
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centre = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centre + (centre - worst)
        fr = f(reflected)
        calls += 1
        if fr < values[0]:
            expanded = centre + 2.0 * (centre - worst)
            fe = f(expanded)
            calls += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inside = centre + 0.5 * (worst - centre)
            fc = f(inside)
            calls += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = inside, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = f(simplex[i])
                    calls += 1
    i = int(np.argmin(values))
    return simplex[i], values[i]


#: Each coefficient's scale near zero in the search (a small value of its kind).
_FLOORS = {
    "token_s": 1e-5,
    "attention_s": 1e-9,
    "context_s": 1e-7,
    "chunk_s": 0.005,
    "seq_s": 0.002,
    "front_in_s": 0.002,
    "front_out_s": 0.001,
}


__all__ = [
    "REFINED",
    "RunCalibration",
    "calibrate_from_profile",
    "calibrate_from_report",
    "fit_contention",
    "fit_isolated",
    "fit_timer",
    "isolated_requests",
    "load_samples",
    "nelder_mead",
    "refine_by_replay",
    "replay_error",
]
