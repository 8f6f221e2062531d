"""What ``kvtier bench serve`` measured: each server's start and warm-up, each client run with
the caches' counters and the connector's records, and the ratios against vLLM alone next to the
issue's thresholds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.bench.serve_client import ClientResult
from kvtier.bench.serve_config import (
    CEILING,
    DISK_VS_EXAMPLE_TARGET,
    GAIN_SHARE_TARGET,
    LAYERWISE_TTFT_TOLERANCE,
    NOTHING_TO_GAIN,
    PRELOAD_WAIT_TARGET,
    REFERENCE,
    SYSTEMS,
    THROUGHPUT_TOLERANCE,
    TTFT_SPEEDUP_TARGET,
    ServeBenchConfig,
)
from kvtier.bench.serve_metrics import CacheCounters
from kvtier.bench.stats import median_ratio_interval, pearson_r

if TYPE_CHECKING:
    from kvtier.bench.serve_preload import PreloadResult

#: The figures a system's share of the possible gain is given for: their label and the client's
#: field (TTFT in ms, the run's duration in s).
GAIN_METRICS = {
    "p50": "ttft_median_ms",
    "mean": "ttft_mean_ms",
    "p99": "ttft_p99_ms",
    "duration": "duration_s",
}
#: The figures the ceiling target and the nothing-to-gain check look at.
GAIN_TARGET_METRICS = ("mean", "duration")

#: How the name of vLLM's engine core process starts (``VLLM::EngineCore``, of which
#: ``/proc/<pid>/stat`` keeps 15 characters).
ENGINE_CORE_PROCESS = "VLLM::Engine"


def engine_core_seconds(cpu_s: dict[str, float]) -> float | None:
    """CPU seconds of vLLM's engine core among a run's seconds by process name (None: not
    measured). Most of it is its busy wait for the worker, which takes a core from the forward
    on a small host."""
    used = [v for name, v in cpu_s.items() if name.startswith(ENGINE_CORE_PROCESS)]
    return sum(used) if used else None


@dataclass(frozen=True)
class WarmUp:
    """The warm-up of one server: a primer, then one timed cold prompt (one token out)."""

    seconds: float
    cold_tokens: int
    cold_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.cold_tokens / self.cold_s if self.cold_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prefill_tokens_per_s": self.prefill_tokens_per_s}


@dataclass(frozen=True)
class SystemInfo:
    """One system's server: its start, warm-up, KV connector config and log, or its failure."""

    system: str
    startup_s: float = 0.0
    warmup: WarmUp | None = None
    kv_transfer_config: dict[str, Any] | None = None
    log: str = ""
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["warmup"] = self.warmup.as_dict() if self.warmup else None
        return out


@dataclass(frozen=True)
class RunResult:
    """One client run: which system, dataset, concurrency and round; the client's figures and
    what ``/metrics`` counted meanwhile."""

    system: str
    dataset: str
    concurrency: int
    seed: int
    round: int
    client: ClientResult
    cache: CacheCounters
    wall_s: float
    result_file: str
    argv: tuple[str, ...] = ()
    series: dict[str, float] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    quiet_wait_s: float = 0.0
    idle_wait_s: float = 0.0  # waited for the held servers to stop spinning before the run
    cpu_s: dict[str, float] = field(default_factory=dict)  # by server process, during the run

    def engine_core_cpu_s(self) -> float | None:
        """CPU seconds vLLM's engine core used during the run (None: not measured)."""
        return engine_core_seconds(self.cpu_s)

    def as_dict(self, detailed: bool = False) -> dict[str, Any]:
        return {
            "system": self.system,
            "dataset": self.dataset,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "round": self.round,
            "client": self.client.as_dict(detailed),
            "cache": self.cache.as_dict(),
            "wall_s": self.wall_s,
            "result_file": self.result_file,
            "argv": list(self.argv),
            "series": self.series,
            "records": self.records,
            "load_average_1m": list(self.load),
            "quiet_wait_s": self.quiet_wait_s,
            "idle_wait_s": self.idle_wait_s,
            "cpu_s": self.cpu_s,
        }


@dataclass(frozen=True)
class Target:
    """A measured ratio next to the issue's threshold (``passed`` None: not measured)."""

    name: str
    measured: float | None
    required: str
    passed: bool | None
    detail: str = ""

    @property
    def verdict(self) -> str:
        return "n/a" if self.passed is None else ("PASS" if self.passed else "MISS")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or num < 0:
        return None
    return num / den


@dataclass
class ServeReport:
    """Everything one ``kvtier bench serve`` measured."""

    config: ServeBenchConfig
    systems: list[SystemInfo]
    runs: list[RunResult]
    environment: dict[str, Any] = field(default_factory=dict)
    tiers: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    preload: PreloadResult | None = None

    def prefix_runs(self, system: str, concurrency: int) -> list[RunResult]:
        """``system``'s reuse runs at ``concurrency``, one a round, in the order they ran."""
        return [
            run
            for run in self.runs
            if run.dataset != "random" and (run.system, run.concurrency) == (system, concurrency)
        ]

    def prefix_run(self, system: str, concurrency: int) -> RunResult | None:
        """``system``'s first reuse run at ``concurrency`` (None: none ran)."""
        runs = self.prefix_runs(system, concurrency)
        return runs[0] if runs else None

    def random_runs(self, system: str) -> list[RunResult]:
        return [r for r in self.runs if r.dataset == "random" and r.system == system]

    def figure(self, system: str, concurrency: int, metric: str = "p50") -> float | None:
        """One of :data:`GAIN_METRICS` of ``system``'s prefix runs at ``concurrency``, the
        median over rounds (None: no usable run)."""
        values = [
            getattr(run.client, GAIN_METRICS[metric])
            for run in self.prefix_runs(system, concurrency)
            if run.client.completed
        ]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def ratio(self, system: str, concurrency: int, metric: str = "p50") -> float | None:
        """``system``'s figure over vLLM alone's on ``metric`` at ``concurrency``. Where the runs
        interleave, the median of each round's ratio (the two runs of a round lie minutes apart
        on the same requests); else the ratio of the medians (None: no usable pair)."""
        if not self.config.interleave:
            return _ratio(
                self.figure(system, concurrency, metric),
                self.figure(REFERENCE, concurrency, metric),
            )
        attr = GAIN_METRICS[metric]
        refs = {r.round: r for r in self.prefix_runs(REFERENCE, concurrency) if r.client.completed}
        ratios = [
            _ratio(getattr(run.client, attr), getattr(refs[run.round].client, attr))
            for run in self.prefix_runs(system, concurrency)
            if run.client.completed and run.round in refs
        ]
        ratios = [r for r in ratios if r is not None]
        return statistics.median(ratios) if ratios else None

    def p50(self, system: str, concurrency: int) -> float | None:
        """TTFT p50 (ms) of ``system``'s prefix run at ``concurrency`` (None: none usable)."""
        return self.figure(system, concurrency, "p50")

    def fastest_ttft_ms(self, concurrency: int) -> float | None:
        """The fastest first token any system's prefix run served at ``concurrency`` (ms): a
        request whose prefix is already in place still computes its suffix, so no connector's
        TTFT goes below it on this machine."""
        ttfts = [
            t
            for run in self.runs
            if run.dataset != "random" and run.concurrency == concurrency
            for t in run.client.ttfts_s
        ]
        return min(ttfts) * 1e3 if ttfts else None

    def _disk_detail(self, concurrency: int) -> str:
        disk, example = self.p50("kvtier-disk", concurrency), self.p50("example", concurrency)
        detail = _pair(disk, example, "disk", "example")
        floor = self.fastest_ttft_ms(concurrency)
        if example is not None and floor is not None and DISK_VS_EXAMPLE_TARGET * example < floor:
            detail += (
                f"; {DISK_VS_EXAMPLE_TARGET:g}× example is {DISK_VS_EXAMPLE_TARGET * example:.0f}"
                f" ms, below the fastest first token any system served here ({floor:.0f} ms)"
            )
        return detail

    def speedup(self, system: str, concurrency: int) -> float | None:
        """vLLM alone's TTFT p50 over ``system``'s, at ``concurrency``."""
        return _ratio(self.p50(REFERENCE, concurrency), self.p50(system, concurrency))

    def share_of_gain(self, system: str, concurrency: int, metric: str = "p50") -> float | None:
        """How much of what the ceiling (a pool that holds everything) saves over vLLM alone on
        ``metric`` ``system`` saves too, at ``concurrency``: (alone − system) / (alone −
        ceiling) (None: no ceiling run, or no gain)."""
        ref = self.figure(REFERENCE, concurrency, metric)
        top = self.figure(CEILING, concurrency, metric)
        mine = self.figure(system, concurrency, metric)
        if ref is None or top is None or mine is None or ref - top <= 0:
            return None
        return (ref - mine) / (ref - top)

    def nothing_to_gain(self, concurrency: int) -> bool | None:
        """Whether the workload leaves a tiering nothing to gain at ``concurrency`` (None: not
        run). It does when the ceiling kept no more KV than vLLM alone did — its prefix cache
        hit fewer than :data:`NOTHING_TO_GAIN` of the prompt tokens more, with no fewer
        preemptions (the engines' own counters: what a tiering could have given back) — or
        when the ceiling's TTFT mean is within noise of vLLM alone's: under
        :data:`NOTHING_TO_GAIN` below it, or with a 90 % bootstrap interval over the requests
        that reaches no gain. Both systems were sent the same requests in the same order (one
        dataset, one seed), so the interval pairs them request by request; the counters also
        see through a machine whose speed drifts between the two systems' runs. With several
        rounds: the first round's counters and pairs, the means' medians over rounds."""
        ref, top = self.prefix_run(REFERENCE, concurrency), self.prefix_run(CEILING, concurrency)
        if ref is None or top is None or not ref.client.completed or not top.client.completed:
            return None
        ref_mean = self.figure(REFERENCE, concurrency, "mean")
        top_mean = self.figure(CEILING, concurrency, "mean")
        if not ref_mean or top_mean is None:
            return None
        kept = top.cache.local_hits - ref.cache.local_hits
        prompts = max(ref.cache.prompt_tokens, top.cache.prompt_tokens)
        no_more_kept = prompts > 0 and kept < NOTHING_TO_GAIN * prompts
        if no_more_kept and top.cache.preemptions >= ref.cache.preemptions:
            return True
        top_ratio = self.ratio(CEILING, concurrency, "mean")
        if top_ratio is not None and 1 - top_ratio < NOTHING_TO_GAIN:
            return True
        a, b = top.client.ttfts_s, ref.client.ttfts_s
        interval = median_ratio_interval(a, b, statistic=np.mean, paired=len(a) == len(b))
        return interval is not None and interval[1] >= 1.0

    def _ceiling_target(self, concurrency: int) -> Target | None:
        """kvtier's share of the possible gain, or where there is none, kvtier against vLLM
        alone (None: the ceiling or kvtier did not run)."""
        nothing = self.nothing_to_gain(concurrency)
        if nothing is None or self.prefix_run("kvtier", concurrency) is None:
            return None
        figures = {
            m: (self.figure(REFERENCE, concurrency, m), self.figure("kvtier", concurrency, m))
            for m in GAIN_TARGET_METRICS
        }
        detail = "; ".join(
            f"{m}: vLLM {ref:,.1f}, kvtier {mine:,.1f}, ceiling "
            f"{self.figure(CEILING, concurrency, m):,.1f}"
            for m, (ref, mine) in figures.items()
            if ref is not None and mine is not None
        )
        if nothing:
            ratios = [self.ratio("kvtier", concurrency, m) for m in figures]
            worst = None if None in ratios else max(ratios)
            return Target(
                f"nothing to gain at concurrency {concurrency}: kvtier / vLLM alone, TTFT mean "
                "and duration",
                worst,
                f"≤ {1 + NOTHING_TO_GAIN:.2f}",
                None if worst is None else worst <= 1 + NOTHING_TO_GAIN,
                detail,
            )
        shares = [self.share_of_gain("kvtier", concurrency, m) for m in GAIN_TARGET_METRICS]
        least = None if None in shares else min(shares)
        return Target(
            f"kvtier share of the possible gain (TTFT mean, duration), concurrency {concurrency}",
            least,
            f"≥ {GAIN_SHARE_TARGET:.0%}",
            None if least is None else least >= GAIN_SHARE_TARGET,
            detail,
        )

    def random_rounds(self, system: str) -> list[float]:
        """Total token throughput (tokens/s) of each of ``system``'s random rounds that ran."""
        values = [r.client.total_token_throughput for r in self.random_runs(system)]
        return [v for v in values if v > 0]

    def random_throughput(self, system: str) -> float | None:
        """Median total token throughput (tokens/s) of ``system``'s random rounds."""
        values = self.random_rounds(system)
        return statistics.median(values) if values else None

    def random_interval(self) -> tuple[float, float] | None:
        """90 % bootstrap interval of kvtier / vLLM alone's median random throughput."""
        return median_ratio_interval(self.random_rounds("kvtier"), self.random_rounds(REFERENCE))

    def random_engine_cpu(self, system: str) -> float | None:
        """Median CPU seconds vLLM's engine core used per random round of ``system``."""
        values = [v for r in self.random_runs(system) if (v := r.engine_core_cpu_s()) is not None]
        return statistics.median(values) if values else None

    def random_spin_correlation(self) -> float | None:
        """Pearson r of each random round's throughput against its engine core's CPU seconds,
        over every system's rounds (None: fewer than four rounds measured, or no spread)."""
        pairs = [
            (r.client.total_token_throughput, cpu)
            for r in self.runs
            if r.dataset == "random"
            and r.client.total_token_throughput > 0
            and (cpu := r.engine_core_cpu_s()) is not None
        ]
        if len(pairs) < 4:
            return None
        tput, cpu = zip(*pairs, strict=True)
        return pearson_r(tput, cpu)

    def _spin_detail(self) -> str:
        ref, kv = self.random_engine_cpu(REFERENCE), self.random_engine_cpu("kvtier")
        if ref is None or kv is None:
            return ""
        detail = f"; engine core CPU a round (median) {ref:.1f} s vLLM, {kv:.1f} s kvtier"
        r = self.random_spin_correlation()
        return detail + (f", throughput against it r = {r:+.2f}" if r is not None else "")

    def targets(self) -> list[Target]:
        """The measured ratios against the issue's thresholds."""
        out = []
        for c in self.config.concurrency:
            if "kvtier" in self.config.systems:
                s = self.speedup("kvtier", c)
                out.append(
                    Target(
                        f"kvtier TTFT p50 speed-up vs vLLM alone, concurrency {c}",
                        s,
                        f"≥ {TTFT_SPEEDUP_TARGET:g}×",
                        None if s is None else s >= TTFT_SPEEDUP_TARGET,
                        _pair(self.p50(REFERENCE, c), self.p50("kvtier", c), "vLLM", "kvtier"),
                    )
                )
        out.extend(t for c in self.config.concurrency if (t := self._ceiling_target(c)))
        if {"kvtier-layerwise", "kvtier-whole"} <= set(self.config.systems):
            out.extend(t for c in self.config.concurrency for t in self._layerwise_targets(c))
        for c in self.config.concurrency:
            if {"kvtier-disk", "example"} <= set(self.config.systems):
                r = _ratio(self.p50("kvtier-disk", c), self.p50("example", c))
                out.append(
                    Target(
                        f"kvtier-disk / ExampleConnector TTFT p50, concurrency {c}",
                        r,
                        f"≤ {DISK_VS_EXAMPLE_TARGET:g}",
                        None if r is None else r <= DISK_VS_EXAMPLE_TARGET,
                        self._disk_detail(c),
                    )
                )
        if len(self.config.random_systems()) == 2:
            ref, kv = self.random_throughput(REFERENCE), self.random_throughput("kvtier")
            r = _ratio(kv, ref)
            rounds = len(self.random_runs("kvtier"))
            how = "alternating" if self.config.alternating() else "one after the other"
            interval = self.random_interval()
            spread = (
                f"; 90 % interval {interval[0]:.2f}-{interval[1]:.2f} from resampling the rounds"
                if interval is not None
                else ""
            )
            out.append(
                Target(
                    "random (no reuse): kvtier / vLLM alone throughput",
                    r,
                    f"≥ {1 - THROUGHPUT_TOLERANCE:.2f} (within {THROUGHPUT_TOLERANCE:.0%})",
                    None if r is None else r >= 1 - THROUGHPUT_TOLERANCE,
                    (
                        f"median of {rounds} rounds {how}: kvtier {kv or 0:.0f} vs vLLM "
                        f"{ref or 0:.0f} tok/s{spread}{self._spin_detail()}"
                    ),
                )
            )
        if self.preload is not None:
            out.append(self._preload_target(self.preload))
        return out

    def _layerwise_targets(self, concurrency: int) -> list[Target]:
        """Layer-by-layer loading (kvtier-layerwise) against whole-request loading
        (kvtier-whole): the seconds forwards waited for KV fall, and TTFT p50 is no worse."""
        layer = self.prefix_runs("kvtier-layerwise", concurrency)
        whole = self.prefix_runs("kvtier-whole", concurrency)
        if not layer or not whole:
            return []
        a = statistics.median(r.cache.kvtier_forward_blocked_s for r in layer)
        b = statistics.median(r.cache.kvtier_forward_blocked_s for r in whole)
        blocked = _ratio(a, b)
        ttft = _ratio(
            self.p50("kvtier-layerwise", concurrency), self.p50("kvtier-whole", concurrency)
        )
        pair = _pair(
            self.p50("kvtier-layerwise", concurrency), self.p50("kvtier-whole", concurrency),
            "layer by layer", "whole",
        )  # fmt: skip
        return [
            Target(
                f"forward blocked for KV, layer by layer / whole, concurrency {concurrency}",
                blocked,
                "< 1",
                None if blocked is None else blocked < 1,
                f"{a:.2f} s vs {b:.2f} s",
            ),
            Target(
                f"TTFT p50, layer by layer / whole, concurrency {concurrency}",
                ttft,
                f"≤ {1 + LAYERWISE_TTFT_TOLERANCE:.2f} (no worse, within drift)",
                None if ttft is None else ttft <= 1 + LAYERWISE_TTFT_TOLERANCE,
                pair,
            ),
        ]

    @staticmethod
    def _preload_target(result: PreloadResult) -> Target:
        share = result.wait_share()
        on, off = result.runs.get("preload"), result.runs.get("on-demand")
        if on is None or off is None:
            detail = f"not measured: {result.error}" if result.error else "not measured"
        else:
            change = result.ttft_p50_change()
            detail = (
                f"wait for KV {on.wait_s:.2f} s vs {off.wait_s:.2f} s on demand; hit TTFT p50 "
                f"{(on.hit_ttft_p50_s or 0) * 1e3:.0f} vs {(off.hit_ttft_p50_s or 0) * 1e3:.0f} ms"
                + (f" ({change:.2f}×)" if change is not None else "")
            )
        return Target(
            "preloading: engine wait for KV after scheduling, preload / on demand",
            share,
            f"≤ {PRELOAD_WAIT_TARGET:g} (falls ≥ {1 - PRELOAD_WAIT_TARGET:.0%})",
            None if share is None else share <= PRELOAD_WAIT_TARGET,
            detail,
        )

    def to_dict(self, detailed: bool = False) -> dict[str, Any]:
        """The whole report, JSON-ready (per-request TTFTs only when ``detailed``)."""
        ratios = {
            str(c): {s: self.speedup(s, c) for s in self.config.ordered_systems()}
            for c in self.config.concurrency
        }
        return {
            "schema": "kvtier.bench.serve/1",
            "targets": [t.as_dict() for t in self.targets()],
            "target_shape_gaps": self.config.shape_gaps(),
            "ttft_p50_speedup_vs_vllm": ratios,
            "ttft_p50_share_of_possible_gain": {
                str(c): {s: self.share_of_gain(s, c) for s in self.config.ordered_systems()}
                for c in self.config.concurrency
            },
            "share_of_possible_gain": {
                m: {
                    str(c): {s: self.share_of_gain(s, c, m) for s in self.config.ordered_systems()}
                    for c in self.config.concurrency
                }
                for m in GAIN_METRICS
            },
            "nothing_to_gain": {str(c): self.nothing_to_gain(c) for c in self.config.concurrency},
            "figures": {
                m: {
                    str(c): {s: self.figure(s, c, m) for s in self.config.ordered_systems()}
                    for c in self.config.concurrency
                }
                for m in GAIN_METRICS
            },
            "random_throughput": {
                s: self.random_throughput(s) for s in self.config.random_systems()
            },
            "random_ratio_interval_90": self.random_interval(),
            "random_engine_core_cpu_s": {
                s: self.random_engine_cpu(s) for s in self.config.random_systems()
            },
            "random_throughput_vs_engine_cpu_r": self.random_spin_correlation(),
            "systems": [s.as_dict() for s in self.systems],
            "runs": [r.as_dict(detailed) for r in self.runs],
            "tiers": self.tiers,
            "environment": self.environment,
            "seconds": self.seconds,
            "preload": self.preload.as_dict() if self.preload is not None else None,
            "config": self.config.as_dict(),
        }


def _pair(a: float | None, b: float | None, name_a: str, name_b: str) -> str:
    if a is None or b is None:
        return "not measured"
    return f"{name_a} {a:.0f} ms, {name_b} {b:.0f} ms"


def summarize_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the connector's records of one run say: requests by decision, tokens it held and
    loaded (by tier), vLLM's own hits, the mean wait for KV."""
    decisions: dict[str, int] = {}
    hit: dict[str, float] = {}
    loaded = local = 0.0
    waits = []
    for r in records:
        decision = str(r.get("decision") or "none")
        decisions[decision] = decisions.get(decision, 0) + 1
        for tier, tokens in (r.get("hit_tokens") or {}).items():
            hit[tier] = hit.get(tier, 0.0) + float(tokens)
        loaded += float(r.get("loaded_tokens") or 0)
        local += float(r.get("local_hit_tokens") or 0)
        if r.get("loaded_tokens"):
            waits.append(float(r.get("load_wait_s") or 0.0))
    return {
        "requests": len(records),
        "decisions": dict(sorted(decisions.items())),
        "hit_tokens": dict(sorted(hit.items())),
        "loaded_tokens": loaded,
        "local_hit_tokens": local,
        "load_wait_s_mean": statistics.fmean(waits) if waits else None,
    }


def iter_prefix_runs(report: ServeReport) -> Iterator[RunResult]:
    """The prefix runs by concurrency, then system order, then round."""
    order = {s: i for i, s in enumerate(SYSTEMS)}
    runs = [r for r in report.runs if r.dataset != "random"]
    yield from sorted(runs, key=lambda r: (r.concurrency, order[r.system], r.round))


__all__ = [
    "GAIN_METRICS",
    "RunResult",
    "ServeReport",
    "SystemInfo",
    "Target",
    "WarmUp",
    "iter_prefix_runs",
    "summarize_records",
]
