"""`kvtier bench serve`: the client's arguments, its result files (real ones, saved by vLLM's
unmodified client in a tiny run), /metrics differences, the ratios and targets, the run's order,
the report, and bad input refused by the CLI before any server starts."""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from rich.console import Console

from kvtier.bench import serve as serve_mod
from kvtier.bench.serve import ServeBench, wait_idle, wait_quiet
from kvtier.bench.serve_client import (
    ClientError,
    ClientResult,
    ClientRun,
    ClientWorker,
    prefix_repetition_args,
    random_args,
)
from kvtier.bench.serve_config import (
    SYSTEMS,
    PrefixWorkload,
    PreloadWorkload,
    RandomWorkload,
    ServeBenchConfig,
    SystemPaths,
    tier_sizes,
    transfer_config,
)
from kvtier.bench.serve_metrics import CacheCounters, delta, parse_metrics
from kvtier.bench.serve_preload import PreloadResult, PreloadRun
from kvtier.bench.serve_report import random_table, serve_json, serve_plot, serve_table
from kvtier.bench.serve_results import (
    RunResult,
    ServeReport,
    SystemInfo,
    WarmUp,
    summarize_records,
)
from kvtier.cli.main import app
from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.dtype import engine_dtype
from kvtier.engines.vllm.records import read_records
from kvtier.errors import ConfigError
from kvtier.testing.cli import run_cli

DATA = Path(__file__).parent / "data"
PREFIX_FILE = DATA / "vllm_bench_serve_prefix_repetition.json"
RANDOM_FILE = DATA / "vllm_bench_serve_random.json"


# --- the client's arguments ----------------------------------------------------------------------
def _run(tmp_path: Path, dataset_args: tuple[str, ...]) -> ClientRun:
    return ClientRun(
        "http://127.0.0.1:1234",
        "/models/m",
        dataset_args,
        24,
        4,
        7,
        tmp_path / "results",
        "r.json",
        "kvtier-prefix_repetition",
    )


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_argv_of_a_prefix_repetition_run(tmp_path):
    run = _run(tmp_path, prefix_repetition_args(2048, 64, 6, 4))
    argv = run.argv()
    assert _flag(argv, "--backend") == "openai"
    assert _flag(argv, "--endpoint") == "/v1/completions"
    assert _flag(argv, "--base-url") == "http://127.0.0.1:1234"
    assert _flag(argv, "--dataset-name") == "prefix_repetition"
    assert _flag(argv, "--prefix-repetition-prefix-len") == "2048"
    assert _flag(argv, "--prefix-repetition-suffix-len") == "64"
    assert _flag(argv, "--prefix-repetition-num-prefixes") == "6"
    assert _flag(argv, "--prefix-repetition-output-len") == "4"
    assert _flag(argv, "--num-prompts") == "24"
    assert _flag(argv, "--max-concurrency") == "4"
    assert _flag(argv, "--seed") == "7"
    assert _flag(argv, "--result-dir") == str(tmp_path / "results")
    assert _flag(argv, "--result-filename") == "r.json"
    assert {"--save-result", "--save-detailed", "--ignore-eos", "--disable-tqdm"} <= set(argv)
    assert run.result_path == tmp_path / "results" / "r.json"


def test_argv_of_a_random_run(tmp_path):
    argv = _run(tmp_path, random_args(512, 16)).argv()
    assert _flag(argv, "--dataset-name") == "random"
    assert _flag(argv, "--random-input-len") == "512"
    assert _flag(argv, "--random-output-len") == "16"
    assert _flag(argv, "--random-range-ratio") == "0"


def test_vllms_own_parser_takes_the_arguments(tmp_path):
    pytest.importorskip("vllm")
    from kvtier.harness.bench_client import client_parser

    parser = client_parser()
    a = parser.parse_args(_run(tmp_path, prefix_repetition_args(2048, 64, 6, 4)).argv())
    assert (a.dataset_name, a.prefix_repetition_prefix_len, a.prefix_repetition_num_prefixes) == (
        "prefix_repetition",
        2048,
        6,
    )
    assert (a.num_prompts, a.max_concurrency, a.seed, a.save_result) == (24, 4, 7, True)
    assert a.metric_percentiles == "50,90,99" and a.result_filename == "r.json"
    b = parser.parse_args(_run(tmp_path, random_args(512, 16)).argv())
    assert (b.dataset_name, b.random_input_len, b.random_output_len) == ("random", 512, 16)


# --- the client's result files -------------------------------------------------------------------
def test_real_result_files_are_read():
    r = ClientResult.from_file(PREFIX_FILE)
    raw = json.loads(PREFIX_FILE.read_text())
    assert (r.completed, r.failed) == (raw["completed"], raw["failed"])
    assert r.ttft_median_ms == raw["median_ttft_ms"] and r.ttft_p99_ms == raw["p99_ttft_ms"]
    assert r.ttft_mean_ms == raw["mean_ttft_ms"]
    assert r.total_token_throughput == raw["total_token_throughput"]
    assert r.input_tokens == raw["total_input_tokens"] and r.max_concurrency == 2
    assert len(r.ttfts_s) == raw["completed"] and r.errors == ()
    rnd = ClientResult.from_file(RANDOM_FILE)
    assert rnd.output_tokens == json.loads(RANDOM_FILE.read_text())["total_output_tokens"]
    assert r.as_dict()["ttfts_s"] == len(r.ttfts_s)
    assert r.as_dict(detailed=True)["ttfts_s"] == list(r.ttfts_s)


def test_failed_and_broken_results(tmp_path):
    raw = json.loads(PREFIX_FILE.read_text())
    none_ok = {**raw, "completed": 0, "failed": 4, "errors": ["boom", "", "boom", ""]}
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms"):
        none_ok.pop(key)
    r = ClientResult.from_dict(none_ok)
    assert (r.completed, r.failed, r.ttft_median_ms) == (0, 4, 0.0)
    assert r.errors == ("boom", "boom")
    missing = dict(raw)
    del missing["median_ttft_ms"]
    with pytest.raises(ClientError, match="median_ttft_ms"):
        ClientResult.from_dict(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ClientError, match="not JSON"):
        ClientResult.from_file(bad)
    with pytest.raises(ClientError, match="cannot read"):
        ClientResult.from_file(tmp_path / "absent.json")


# --- /metrics ------------------------------------------------------------------------------------
def _metrics(queries: float, hits: float, ext_q: float, ext_h: float, dram: float) -> str:
    return textwrap.dedent(
        f"""\
        # HELP vllm:prefix_cache_queries_total Prefix cache queries, in queried tokens.
        # TYPE vllm:prefix_cache_queries_total counter
        vllm:prefix_cache_queries_total{{engine="0",model_name="/m"}} {queries}
        # HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
        # TYPE vllm:prefix_cache_hits_total counter
        vllm:prefix_cache_hits_total{{engine="0",model_name="/m"}} {hits}
        # HELP vllm:external_prefix_cache_queries_total External prefix cache queries.
        # TYPE vllm:external_prefix_cache_queries_total counter
        vllm:external_prefix_cache_queries_total{{engine="0",model_name="/m"}} {ext_q}
        # HELP vllm:external_prefix_cache_hits_total External prefix cache hits.
        # TYPE vllm:external_prefix_cache_hits_total counter
        vllm:external_prefix_cache_hits_total{{engine="0",model_name="/m"}} {ext_h}
        # HELP vllm:prompt_tokens_total Number of prefill tokens processed.
        # TYPE vllm:prompt_tokens_total counter
        vllm:prompt_tokens_total{{engine="0",model_name="/m"}} {queries}
        # HELP vllm:num_requests_running Number of requests in model execution batches.
        # TYPE vllm:num_requests_running gauge
        vllm:num_requests_running{{engine="0",model_name="/m"}} 0.0
        # HELP kvtier_loaded_tokens_total prompt tokens loaded from kvtier instead of prefilled
        # TYPE kvtier_loaded_tokens_total counter
        kvtier_loaded_tokens_total{{engine="0",model_name="/m"}} {dram + 256}
        kvtier_loaded_tokens_created{{engine="0",model_name="/m"}} 1.7e9
        # HELP kvtier_tier_hit_tokens_total tokens loaded from this tier
        # TYPE kvtier_tier_hit_tokens_total counter
        kvtier_tier_hit_tokens_total{{engine="0",model_name="/m",tier="dram"}} {dram}
        kvtier_tier_hit_tokens_total{{engine="0",model_name="/m",tier="disk"}} 256.0
        """
    )


def test_metrics_difference_and_counters():
    before = parse_metrics(_metrics(100, 10, 50, 0, 0))
    assert "vllm:num_requests_running" not in before  # not one of the kept series
    assert not any(k.endswith("_created") or "engine=" in k for k in before)
    after = parse_metrics(_metrics(1100, 410, 650, 300, 512))
    d = delta(before, after)
    assert "kvtier_tier_hit_tokens_total{tier=disk}" not in d  # unchanged
    k = CacheCounters.from_delta(d)
    assert (k.local_queries, k.local_hits, k.prompt_tokens) == (1000, 400, 1000)
    assert k.local_hit_rate == pytest.approx(0.4)
    assert k.external_hit_rate == pytest.approx(0.5)
    assert k.kvtier_loaded_tokens == 512 and k.tier_hit_tokens == {"dram": 512}
    assert CacheCounters().local_hit_rate is None
    assert CacheCounters.from_delta(delta(before, after)).as_dict()["local_hit_rate"] == 0.4


# --- configuration -------------------------------------------------------------------------------
def test_defaults_size_the_pool_below_the_prefixes():
    c = ServeBenchConfig()
    assert c.model_len() == 2304  # 2048 + 64 + 4 + slack, in 256s
    assert c.pool() == 32 < c.prefix.prefix_blocks == 64
    assert c.prefix.prompts_per_prefix == 4
    assert not c.alternating()  # one random round
    assert "prefix 2048 < 4096 tokens" in c.shape_gaps()
    full = ServeBenchConfig(
        concurrency=(1, 4, 8),
        prefix=PrefixWorkload(4096, 128, 12, 48, 4),
        random=RandomWorkload(1024, 16, 16, 4, 3),
    )
    assert full.shape_gaps() == [] and full.alternating()
    assert ServeBenchConfig(pool_blocks=200).shape_gaps()[-3].startswith("prefixes' 64 blocks")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"systems": ("vllm", "sglang")}, "unknown sglang"),
        ({"systems": ()}, "none given"),
        ({"systems": ("vllm", "vllm")}, "each system once"),
        ({"concurrency": (0,)}, "--concurrency"),
        ({"prefix": PrefixWorkload(num_prefixes=6, prompts=5)}, "--num-prompts 5"),
        ({"quiet_load": 0}, "--quiet-load"),
        ({"prefix": PrefixWorkload(prefix_tokens=0)}, "--prefix-len"),
        ({"random": RandomWorkload(repeats=0)}, "--repeat"),
        ({"reuse_rounds": 0}, "--reuse-rounds"),
        ({"chunk_tokens": 200}, "multiple of vLLM's 128"),
        ({"max_model_len": 1024}, "shorter than the longest request"),
        ({"pool_blocks": 3}, "cannot hold one 2304-token request"),
        ({"dram_size": 0}, "--dram-size"),
    ],
)
def test_bad_configs_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ServeBenchConfig(**kwargs)


def test_transfer_configs(tmp_path):
    paths = SystemPaths(shm=Path("/dev/shm/kvtier-bench-x-kvtier"), disk=tmp_path / "d")
    assert transfer_config("vllm", paths, 1 << 26, 1 << 28, 256) is None
    kv = transfer_config("kvtier", paths, 100 << 20, 300 << 20, 256)
    assert kv["kv_connector"] == "KVTierConnector"
    assert kv["kv_connector_module_path"] == "kvtier.engines.vllm.connector"
    assert kv["kv_load_failure_policy"] == "recompute" and kv["kv_role"] == "kv_both"
    tiers = kv["kv_connector_extra_config"]["tiers"]
    assert tiers == [
        "slab:///dev/shm/kvtier-bench-x-kvtier?size=100MiB&name=dram",
        f"slab://{tmp_path / 'd'}?size=300MiB&name=disk",
    ]
    assert ConnectorConfig.from_extra(kv["kv_connector_extra_config"]).tiers == tuple(tiers)
    disk = transfer_config("kvtier-disk", paths, 1, 300 << 20, 256)
    assert disk["kv_connector_extra_config"]["tiers"] == [tiers[1]]
    for system, layerwise in (("kvtier-whole", False), ("kvtier-layerwise", True)):
        extra = transfer_config(system, paths, 100 << 20, 300 << 20, 256)
        extra = extra["kv_connector_extra_config"]
        assert extra["tiers"] == tiers and ConnectorConfig.from_extra(extra).layerwise is layerwise
    assert ConnectorConfig.from_extra(kv["kv_connector_extra_config"]).layerwise is None
    ex = transfer_config("example", paths, 1, 1, 256)
    assert ex == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "d")},
    }


def test_a_relative_run_folder_gives_tier_urls_kvtier_opens(monkeypatch, tmp_path):
    from kvtier.tiers.registry import check_tier_url

    monkeypatch.chdir(tmp_path)
    config = ServeBenchConfig(work_dir=Path(".kvtier/bench-serve"), shm_dir=Path("shm"))
    paths = ServeBench(config).paths("kvtier")
    assert paths.disk.is_absolute() and paths.shm.is_absolute()
    kv = transfer_config("kvtier", paths, 100 << 20, 300 << 20, 256)
    for url in kv["kv_connector_extra_config"]["tiers"]:
        check_tier_url(url)


def test_tier_sizes_follow_the_workload():
    c = ServeBenchConfig()
    dram, disk = tier_sizes(c, 23040)
    level = (4 * 2048 + 16 * 64) * 23040
    assert dram == int(level * 1.25)
    assert disk == 2 * (2 * level + 8 * 512 * 23040)
    assert tier_sizes(replace(c, dram_size=5, disk_size=7), 23040) == (5, 7)


def test_records_and_quiet_wait(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    lines = [
        {"decision": "", "local_hit_tokens": 2048, "hit_tokens": {}, "loaded_tokens": 0},
        {"decision": "load", "local_hit_tokens": 768, "hit_tokens": {"dram": 1280},
         "loaded_tokens": 1280, "load_wait_s": 0.2},
        {"decision": "load", "local_hit_tokens": 0, "hit_tokens": {"dram": 1024, "disk": 1024},
         "loaded_tokens": 2048, "load_wait_s": 0.4},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    got = read_records(path)
    assert len(got) == 3 and read_records(tmp_path / "none.jsonl") == []
    summary = summarize_records(got)
    assert summary["decisions"] == {"load": 2, "none": 1}
    assert summary["hit_tokens"] == {"disk": 1024.0, "dram": 2304.0}
    assert (summary["loaded_tokens"], summary["local_hit_tokens"]) == (3328.0, 2816.0)
    assert summary["load_wait_s_mean"] == pytest.approx(0.3)
    assert wait_quiet(None, 10) == 0.0
    loads = iter([9.0, 5.0, 1.0])
    monkeypatch.setattr(serve_mod, "_load1", lambda: next(loads))
    naps: list[float] = []
    wait_quiet(2.0, 60, naps.append)
    assert naps == [2.0, 2.0]


class _Spinning:
    """A server whose CPU seconds grow by ``rates[i]`` cores over the i-th window, then 0."""

    def __init__(self, rates: list[float], window: float):
        self.rates, self.window, self.used, self.reads = list(rates), window, 0.0, 0

    def cpu_seconds(self) -> float:
        if self.reads and self.rates:
            self.used += self.rates.pop(0) * self.window
        self.reads += 1
        return self.used


def test_a_run_waits_until_the_held_servers_stop_spinning():
    now = [0.0]

    def nap(s: float) -> None:
        now[0] += s

    clock = lambda: now[0]  # noqa: E731
    busy, quiet = _Spinning([1.6, 0.9, 0.3], 0.5), _Spinning([], 0.5)
    waited = wait_idle([busy, quiet], limit_s=10, share=0.1, window_s=0.5, clock=clock, sleep=nap)
    assert waited == pytest.approx(2.0)  # three busy windows, then a quiet one
    forever = _Spinning([1.0] * 100, 0.5)
    now[0] = 0.0
    assert wait_idle([forever], limit_s=3, window_s=0.5, clock=clock, sleep=nap) == 3.0  # capped
    assert wait_idle([]) == 0.0


# --- ratios and targets --------------------------------------------------------------------------
def _result(median_ms: float, throughput: float = 100.0, completed: int = 24) -> ClientResult:
    raw = json.loads(PREFIX_FILE.read_text())
    raw.update(median_ttft_ms=median_ms, total_token_throughput=throughput, completed=completed)
    return ClientResult.from_dict(raw)


def _runs(p50: dict[tuple[str, int], float], random: dict[str, list[float]]) -> list[RunResult]:
    out = [
        RunResult(s, "prefix_repetition", c, i, 0, _result(ms), CacheCounters(), 1.0, "f")
        for i, ((s, c), ms) in enumerate(p50.items())
    ]
    for s, values in random.items():
        out += [
            RunResult(s, "random", 4, 1000 + r, r, _result(500, v), CacheCounters(), 1.0, "f")
            for r, v in enumerate(values)
        ]
    return out


def _report(config: ServeBenchConfig | None = None) -> ServeReport:
    p50 = {
        ("vllm", 1): 6000.0,
        ("kvtier", 1): 1500.0,
        ("kvtier-disk", 1): 2000.0,
        ("example", 1): 6500.0,
        ("vllm", 4): 9000.0,
        ("kvtier", 4): 4000.0,
        ("kvtier-disk", 4): 5000.0,
        ("example", 4): 9000.0,
    }
    random = {"vllm": [100.0, 90.0, 110.0], "kvtier": [98.0, 99.0, 80.0]}
    config = config or ServeBenchConfig(random=RandomWorkload(repeats=3))
    systems = [SystemInfo(s, 50.0, WarmUp(5.0, 2112, 4.0), None, f"{s}.log") for s in SYSTEMS]
    env = {"cpu": "Xeon (avx512_bf16)", "cpus": 2, "vllm": "0.32.0", "filesystem": "ext4"}
    tiers = {"dram_bytes": 1 << 28, "disk_bytes": 1 << 30, "pool_blocks": 48, "pool_tokens": 6144}
    return ServeReport(config, systems, _runs(p50, random), env, tiers, 300.0)


def test_ratios_against_vllm_alone():
    r = _report()
    assert r.speedup("kvtier", 1) == pytest.approx(4.0)
    assert r.speedup("kvtier", 4) == pytest.approx(2.25)
    assert r.speedup("vllm", 1) == pytest.approx(1.0)
    assert r.random_throughput("vllm") == 100.0 and r.random_throughput("kvtier") == 98.0
    by_name = {t.name: t for t in r.targets()}
    t1 = by_name["kvtier TTFT p50 speed-up vs vLLM alone, concurrency 1"]
    t4 = by_name["kvtier TTFT p50 speed-up vs vLLM alone, concurrency 4"]
    assert (t1.measured, t1.verdict, t4.verdict) == (pytest.approx(4.0), "PASS", "MISS")
    d1 = by_name["kvtier-disk / ExampleConnector TTFT p50, concurrency 1"]
    d4 = by_name["kvtier-disk / ExampleConnector TTFT p50, concurrency 4"]
    assert d1.measured == pytest.approx(2000 / 6500) and d1.passed
    assert d4.measured == pytest.approx(5000 / 9000) and d4.passed is False
    rnd = by_name["random (no reuse): kvtier / vLLM alone throughput"]
    assert rnd.measured == pytest.approx(0.98) and rnd.passed
    assert "median of 3 rounds alternating" in rnd.detail
    lo, hi = r.random_interval()
    assert lo < 0.98 < hi and f"90 % interval {lo:.2f}-{hi:.2f}" in rnd.detail


def test_layer_by_layer_loading_is_held_against_whole_request_loading():
    from dataclasses import replace

    config = ServeBenchConfig(
        systems=("vllm", "kvtier-layerwise", "kvtier-whole"), concurrency=(1, 4)
    )
    p50 = {("vllm", 1): 6000.0, ("kvtier-layerwise", 1): 1500.0, ("kvtier-whole", 1): 1480.0}
    p50 |= {("vllm", 4): 9000.0, ("kvtier-layerwise", 4): 4000.0, ("kvtier-whole", 4): 3000.0}
    blocked = {("kvtier-layerwise", 1): 0.5, ("kvtier-whole", 1): 2.0}
    blocked[("kvtier-layerwise", 4)] = 3.0
    blocked[("kvtier-whole", 4)] = 2.0
    runs = [
        replace(
            r,
            cache=CacheCounters(kvtier_forward_blocked_s=blocked.get((r.system, r.concurrency), 0)),
        )
        for r in _runs(p50, {})
    ]
    r = ServeReport(config, [], runs, {}, {}, 1.0)
    by_name = {t.name: t for t in r.targets()}
    b1 = by_name["forward blocked for KV, layer by layer / whole, concurrency 1"]
    t1 = by_name["TTFT p50, layer by layer / whole, concurrency 1"]
    assert b1.measured == pytest.approx(0.25) and b1.passed and "0.50 s vs 2.00 s" in b1.detail
    assert t1.measured == pytest.approx(1500 / 1480) and t1.passed  # within the drift allowed
    b4 = by_name["forward blocked for KV, layer by layer / whole, concurrency 4"]
    t4 = by_name["TTFT p50, layer by layer / whole, concurrency 4"]
    assert b4.passed is False and t4.passed is False


def test_the_engine_cores_spin_is_reported_next_to_the_random_rounds():
    from dataclasses import replace

    r = _report()
    assert r.random_engine_cpu("vllm") is None and r.random_spin_correlation() is None
    rnd = "random (no reuse): kvtier / vLLM alone throughput"
    assert "engine core" not in {t.name: t for t in r.targets()}[rnd].detail  # not measured
    # rounds whose engine core spun longer ran slower (throughput 100, 90, 110 / 98, 99, 80)
    spin = {100.0: 3.0, 90.0: 4.0, 110.0: 2.0, 98.0: 3.1, 99.0: 3.05, 80.0: 6.0}
    r.runs = [
        replace(
            run,
            cpu_s={
                "VLLM::EngineCor": spin[run.client.total_token_throughput],
                "VLLM::Worker": 30.0,
                "python": 0.5,
            },
        )
        if run.dataset == "random"
        else run
        for run in r.runs
    ]
    assert r.random_runs("kvtier")[0].engine_core_cpu_s() == pytest.approx(3.1)
    assert r.random_engine_cpu("vllm") == pytest.approx(3.0)
    assert r.random_engine_cpu("kvtier") == pytest.approx(3.1)
    corr = r.random_spin_correlation()
    assert corr < -0.9
    detail = {t.name: t for t in r.targets()}[rnd].detail
    spun = "engine core CPU a round (median) 3.0 s vLLM, 3.1 s kvtier"
    assert f"{spun}, throughput against it r = {corr:+.2f}" in detail
    d = r.to_dict()
    assert d["random_engine_core_cpu_s"] == {"vllm": 3.0, "kvtier": 3.1}
    assert d["random_throughput_vs_engine_cpu_r"] == pytest.approx(corr)
    assert d["runs"][-1]["cpu_s"]["VLLM::Worker"] == 30.0
    console = Console(record=True, width=220)
    console.print(random_table(r))
    text = console.export_text()
    assert "engine core CPU a round" in text and "3.1 s" in text


def test_a_disk_target_below_the_fastest_first_token_of_the_run_says_so():
    from dataclasses import replace

    r = _report()
    r.runs = [  # every request at concurrency 1 took at least 1.8 s
        replace(run, client=replace(run.client, ttfts_s=(1.8 if run.concurrency == 1 else 0.5,)))
        if run.dataset == "prefix_repetition"
        else run
        for run in r.runs
    ]
    assert r.fastest_ttft_ms(1) == pytest.approx(1800.0) and r.fastest_ttft_ms(8) is None
    by_name = {t.name: t for t in r.targets()}
    d1 = by_name["kvtier-disk / ExampleConnector TTFT p50, concurrency 1"]
    d4 = by_name["kvtier-disk / ExampleConnector TTFT p50, concurrency 4"]
    # half of the example's 6500 ms is 3250 ms: above 1.8 s, so nothing to add
    assert "fastest" not in d1.detail and "fastest" not in d4.detail
    r.runs = [
        replace(run, client=replace(run.client, ttfts_s=(3.5,)))
        if run.concurrency == 1 and run.dataset == "prefix_repetition"
        else run
        for run in r.runs
    ]
    d1 = {t.name: t for t in r.targets()}[d1.name]
    assert "0.5× example is 3250 ms, below the fastest first token" in d1.detail
    assert "(3500 ms)" in d1.detail and d1.passed  # the verdict is still the measured one


def test_missing_figures_are_not_measured():
    r = _report(ServeBenchConfig(systems=("vllm", "kvtier"), random=None))
    r.runs = [x for x in r.runs if not (x.system == "vllm" and x.concurrency == 4)]
    r.runs.append(
        RunResult(
            "kvtier", "prefix_repetition", 8, 9, 0, _result(1, completed=0), CacheCounters(), 1, "f"
        )
    )
    assert r.speedup("kvtier", 4) is None and r.p50("kvtier", 8) is None
    verdicts = [t.verdict for t in r.targets()]
    assert verdicts == ["PASS", "n/a"]  # no disk/example or random pair in this run


def test_report_renders_as_table_json_and_plot(tmp_path):
    r = _report()
    console = Console(record=True, width=220)
    console.print(serve_table(r))
    text = console.export_text()
    assert "prefix_repetition: 4 prefixes × 4 prompts" in text
    assert "4.00×" in text and "ref" in text and "PASS" in text and "MISS" in text
    assert "not the target shape" in text and "Xeon (avx512_bf16)" in text
    data = json.loads(serve_json(r))
    assert data["schema"] == "kvtier.bench.serve/1"
    assert data["ttft_p50_speedup_vs_vllm"]["1"]["kvtier"] == pytest.approx(4.0)
    assert data["random_throughput"] == {"vllm": 100.0, "kvtier": 98.0}
    assert data["random_ratio_interval_90"] == list(r.random_interval())
    assert len(data["runs"]) == 8 + 6 and data["config"]["pool_blocks_used"] == 32
    assert "date" not in data
    stamp = {"date": "2026-12-07", "command": "kvtier bench serve --sessions"}
    stamped = json.loads(serve_json(r, stamp=stamp))
    assert stamped["date"] == "2026-12-07" and stamped["command"].endswith("--sessions")
    png = serve_plot(r, tmp_path / "plots")
    assert png == tmp_path / "plots" / "bench-serve.png" and png.stat().st_size > 0


# --- the run's order -----------------------------------------------------------------------------
class _FakeServer:
    def __init__(self, system: str, log: list):
        self.system, self.log = system, log
        self.base_url, self.model_name = f"http://{system}", "/m"

    def stop(self):
        self.log.append(("stop", self.system))


class _FakeWorker:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _fake_bench(monkeypatch, tmp_path, config: ServeBenchConfig, fail: str | None = None):
    rounds = config.reuse_rounds > 1  # the log names each run's round
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            dict(
                hidden_size=576,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                vocab_size=49152,
                intermediate_size=1536,
            )
        )
    )
    import kvtier.engines.embedded as embedded

    monkeypatch.setattr(embedded, "embedded_model_folder", lambda: (model, "fp", "m"))
    monkeypatch.setattr(serve_mod, "ClientWorker", _FakeWorker)
    log: list = []
    bench = ServeBench(replace(config, work_dir=tmp_path / "w", shm_dir=tmp_path / "shm"))

    def start(system, folder, dram, disk, vocab, report, round_=0):
        log.append(("start", system))
        if system == fail:
            report.systems.append(SystemInfo(system, error="vLLM exited"))
            return None
        report.systems.append(SystemInfo(system, 1.0, WarmUp(1.0, 10, 1.0)))
        return _FakeServer(system, log)

    def client_run(client, server, system, dataset, concurrency, seed, round_, report):
        log.append((dataset, system, concurrency, seed) + ((round_,) if rounds else ()))
        report.runs.append(
            RunResult(
                system, dataset, concurrency, seed, round_, _result(100), CacheCounters(), 1, "f"
            )
        )

    monkeypatch.setattr(bench, "_start", start)
    monkeypatch.setattr(bench, "_client_run", client_run)
    steps: list[str] = []
    bench.on_step = steps.append
    return bench, log, steps


def test_random_rounds_alternate_between_live_servers(monkeypatch, tmp_path):
    config = ServeBenchConfig(concurrency=(1, 4), random=RandomWorkload(repeats=3))
    bench, log, steps = _fake_bench(monkeypatch, tmp_path, config)
    report = bench.run()
    assert log == [
        ("start", "vllm"),
        ("prefix_repetition", "vllm", 1, 0),
        ("prefix_repetition", "vllm", 4, 1),
        ("start", "kvtier"),
        ("prefix_repetition", "kvtier", 1, 0),
        ("prefix_repetition", "kvtier", 4, 1),
        ("random", "vllm", 4, 1000),
        ("random", "kvtier", 4, 1000),
        ("random", "kvtier", 4, 1001),
        ("random", "vllm", 4, 1001),
        ("random", "vllm", 4, 1002),
        ("random", "kvtier", 4, 1002),
        ("stop", "vllm"),
        ("stop", "kvtier"),
        ("start", "kvtier-disk"),
        ("prefix_repetition", "kvtier-disk", 1, 0),
        ("prefix_repetition", "kvtier-disk", 4, 1),
        ("stop", "kvtier-disk"),
        ("start", "example"),
        ("prefix_repetition", "example", 1, 0),
        ("prefix_repetition", "example", 4, 1),
        ("stop", "example"),
    ]
    assert len(steps) == bench.steps() - 4  # the fake start takes no step of its own
    itemsize = 4 if engine_dtype("auto") == "float32" else 2
    assert report.environment["kv_bytes_per_token"] == 30 * 2 * 3 * 64 * itemsize
    assert report.environment["dtype"] == engine_dtype("auto")
    assert report.tiers["pool_blocks"] == 32


def test_one_round_runs_on_each_server_before_it_stops(monkeypatch, tmp_path):
    config = ServeBenchConfig(systems=("kvtier", "vllm"), concurrency=(2,))
    bench, log, _ = _fake_bench(monkeypatch, tmp_path, config, fail=None)
    bench.run()
    assert log == [
        ("start", "vllm"),
        ("prefix_repetition", "vllm", 2, 0),
        ("random", "vllm", 4, 1000),
        ("stop", "vllm"),
        ("start", "kvtier"),
        ("prefix_repetition", "kvtier", 2, 0),
        ("random", "kvtier", 4, 1000),
        ("stop", "kvtier"),
    ]


def test_reuse_rounds_start_every_system_afresh_in_an_order_turned_by_one(monkeypatch, tmp_path):
    systems = ("vllm", "ceiling", "kvtier")
    config = ServeBenchConfig(systems=systems, concurrency=(1, 4), random=None, reuse_rounds=3)
    bench, log, steps = _fake_bench(monkeypatch, tmp_path, config)
    report = bench.run()
    orders = [("vllm", "ceiling", "kvtier"), ("ceiling", "kvtier", "vllm")]
    orders.append(("kvtier", "vllm", "ceiling"))
    expected = [
        entry
        for r, order in enumerate(orders)
        for system in order
        for entry in (
            ("start", system),
            ("prefix_repetition", system, 1, 0, r),  # the same requests every round
            ("prefix_repetition", system, 4, 1, r),
            ("stop", system),
        )
    ]
    assert log == expected
    assert len(steps) == bench.steps() - 9  # the fake start takes no step of its own
    assert [r.round for r in report.prefix_runs("ceiling", 4)] == [0, 1, 2]
    assert len(report.runs) == 18


def _rounds_report(means: dict[str, tuple[float, ...]], **config) -> ServeReport:
    """A report of vLLM alone, the ceiling and kvtier at concurrency 1: each system's TTFT mean
    (ms) a round, its duration (s) a fiftieth of it."""
    base = ServeBenchConfig(systems=("vllm", "ceiling", "kvtier"), concurrency=(1,))
    r = ServeReport(replace(base, reuse_rounds=3, **config), [], [], {}, {}, 0.0)
    r.runs = [
        replace(_timed(system, 1, ms, ms / 50), round=i)
        for system, rounds in means.items()
        for i, ms in enumerate(rounds)
    ]
    return r


def test_figures_over_rounds_are_medians():
    means = {"vllm": (5000.0, 5400.0, 4000.0), "ceiling": (4990.0, 5300.0, 4100.0)}
    means["kvtier"] = (5200.0, 5000.0, 4600.0)  # its first round alone would miss by 4 %
    r = _rounds_report(means)
    assert r.figure("vllm", 1, "mean") == pytest.approx(5000.0)
    assert r.figure("kvtier", 1, "mean") == pytest.approx(5000.0)
    assert r.figure("kvtier", 1, "duration") == pytest.approx(100.0)
    assert r.prefix_run("kvtier", 1).round == 0
    assert r.nothing_to_gain(1) is True  # the ceiling's median is vLLM alone's
    (flat,) = [t for t in r.targets() if t.name.startswith("nothing to gain")]
    assert flat.passed and flat.measured == pytest.approx(1.0)
    assert r.to_dict()["figures"]["mean"]["1"] == {
        "vllm": 5000.0, "ceiling": 4990.0, "kvtier": 5000.0
    }  # fmt: skip
    console = Console(record=True, width=260)
    console.print(serve_table(r))
    text = console.export_text()
    assert "kvtier r3" in text and "medians over rounds" in text


def test_interleaved_rounds_keep_every_server_up_and_alternate_with_fresh_requests(
    monkeypatch, tmp_path
):
    systems = ("vllm", "ceiling", "kvtier")
    config = ServeBenchConfig(
        systems=systems, concurrency=(1, 4), random=RandomWorkload(repeats=3), reuse_rounds=3,
        interleave=True,
    )  # fmt: skip
    bench, log, steps = _fake_bench(monkeypatch, tmp_path, config)
    report = bench.run()
    orders = [("vllm", "ceiling", "kvtier"), ("ceiling", "kvtier", "vllm")]
    orders.append(("kvtier", "vllm", "ceiling"))
    expected = [("start", s) for s in systems]
    for i, conc in enumerate((1, 4)):
        for r, order in enumerate(orders):  # a fresh seed a round, the same for every system
            expected += [("prefix_repetition", s, conc, i + 2 * r, r) for s in order]
    expected.append(("stop", "ceiling"))  # not in the random rounds
    for r, order in enumerate((("vllm", "kvtier"), ("kvtier", "vllm"), ("vllm", "kvtier"))):
        expected += [("random", s, 4, 1000 + r, r) for s in order]
    expected += [("stop", "vllm"), ("stop", "kvtier")]
    assert log == expected
    assert len(steps) == bench.steps() - 3  # the fake start takes no step of its own
    assert [r.round for r in report.prefix_runs("ceiling", 4)] == [0, 1, 2]
    assert config.run_seeds() == [0, 1, 2, 3, 4, 5]
    assert replace(config, interleave=False).run_seeds() == [0, 1]


def test_interleaved_rounds_go_on_without_a_system_that_did_not_start(monkeypatch, tmp_path):
    config = ServeBenchConfig(
        systems=("vllm", "ceiling", "kvtier"), concurrency=(1,), random=None, reuse_rounds=2,
        interleave=True,
    )  # fmt: skip
    bench, log, _ = _fake_bench(monkeypatch, tmp_path, config, fail="ceiling")
    report = bench.run()
    assert log == [
        ("start", "vllm"), ("start", "ceiling"), ("start", "kvtier"),
        ("prefix_repetition", "vllm", 1, 0, 0), ("prefix_repetition", "kvtier", 1, 0, 0),
        ("prefix_repetition", "kvtier", 1, 1, 1), ("prefix_repetition", "vllm", 1, 1, 1),
        ("stop", "vllm"), ("stop", "kvtier"),
    ]  # fmt: skip
    assert report.prefix_runs("ceiling", 1) == []


def test_interleaved_rounds_compare_kvtier_with_vllm_alone_round_by_round():
    means = {"vllm": (6000.0, 4000.0, 5000.0), "ceiling": (6000.0, 4000.0, 5000.0)}
    means["kvtier"] = (6100.0, 4080.0, 5600.0)  # 1.02 in two rounds of three
    r = _rounds_report(means, interleave=True)
    assert r.ratio("kvtier", 1, "mean") == pytest.approx(1.02)
    assert r.ratio("kvtier", 1, "duration") == pytest.approx(1.02)
    assert r.nothing_to_gain(1) is True
    (flat,) = [t for t in r.targets() if t.name.startswith("nothing to gain")]
    assert flat.passed and flat.measured == pytest.approx(1.02)
    r.config = replace(r.config, interleave=False)  # the medians' ratio: 5600 / 5000
    assert r.ratio("kvtier", 1, "mean") == pytest.approx(1.12)
    (flat,) = [t for t in r.targets() if t.name.startswith("nothing to gain")]
    assert not flat.passed
    r.config = replace(r.config, interleave=True)
    console = Console(record=True, width=260)
    console.print(serve_table(r))
    assert "runs alternating" in console.export_text()


def test_sessions_runs_send_fresh_chats_from_a_file_per_concurrency(monkeypatch, tmp_path):
    transformers = pytest.importorskip("transformers")
    from kvtier.engines.embedded import embedded_model_folder

    tokenizer = transformers.AutoTokenizer.from_pretrained(embedded_model_folder()[0])
    prefix = PrefixWorkload(256, 32, 2, 4, 4, sessions=True)
    config = ServeBenchConfig(systems=("kvtier",), concurrency=(1, 2), prefix=prefix, random=None)
    bench, log, _ = _fake_bench(monkeypatch, tmp_path, config, fail=None)
    tokenizer.save_pretrained(tmp_path / "model")  # the fake model folder gets the real one
    bench.run()
    assert log == [
        ("start", "kvtier"),
        ("sessions", "kvtier", 1, 0),
        ("sessions", "kvtier", 2, 1),
        ("stop", "kvtier"),
    ]
    files = []
    for seed in (0, 1):
        args, prompts = bench.dataset_args("sessions", seed)
        assert prompts == 4 and _flag(list(args), "--dataset-name") == "custom"
        path = Path(_flag(list(args), "--dataset-path"))
        assert path.parent == bench.run_dir / "datasets"
        files.append([json.loads(line)["prompt"] for line in path.read_text().splitlines()])
    assert [len(f) for f in files] == [4, 4] and files[0] != files[1]
    assert files[0][2].startswith(files[0][0])  # session 0's second turn follows its first
    with pytest.raises(ValueError, match="no 'random' dataset"):
        bench.dataset_args("random", 0)


def test_a_failed_partner_leaves_the_other_its_rounds(monkeypatch, tmp_path):
    config = ServeBenchConfig(
        systems=("vllm", "kvtier"), concurrency=(1,), random=RandomWorkload(repeats=3)
    )
    bench, log, _ = _fake_bench(monkeypatch, tmp_path, config, fail="kvtier")
    report = bench.run()
    assert log[-5:] == [
        ("start", "kvtier"),
        ("random", "vllm", 4, 1000),
        ("random", "vllm", 4, 1001),
        ("random", "vllm", 4, 1002),
        ("stop", "vllm"),
    ]
    assert [s.error for s in report.systems] == [None, "vLLM exited"]


# --- the client worker ---------------------------------------------------------------------------
FAKE_WORKER = """
import json, shutil, sys
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    argv = json.loads(line)
    if "--fail" in argv:
        print(json.dumps({"ok": False, "error": "ValueError: no"}), flush=True)
        continue
    if "--hang" in argv:
        import time; time.sleep(60)
    out = argv[argv.index("--result-dir") + 1] + "/" + argv[argv.index("--result-filename") + 1]
    shutil.copy(%r, out)
    print("noise on stdout", flush=True)
    print(json.dumps({"ok": True}), flush=True)
"""


@pytest.mark.slow
def test_client_worker_round_trip(monkeypatch, tmp_path):
    (tmp_path / "fakeworker.py").write_text(FAKE_WORKER % str(PREFIX_FILE))
    monkeypatch.setattr("kvtier.bench.serve_client.WORKER_MODULE", "fakeworker")
    run = _run(tmp_path, prefix_repetition_args(256, 32, 2, 2))
    env = {"PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}"}
    with ClientWorker(tmp_path / "client.log", env) as worker:
        pid = worker.pid
        assert (
            worker.run(run, 30).ttft_median_ms
            == json.loads(PREFIX_FILE.read_text())["median_ttft_ms"]
        )
        failing = replace(run, dataset_args=("--fail",))
        with pytest.raises(ClientError, match="ValueError: no"):
            worker.run(failing, 30)
        with pytest.raises(ClientError, match="did not answer"):
            worker.run(replace(run, dataset_args=("--hang",)), 0.5)
    assert worker.pid is None and pid is not None
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


# --- the CLI -------------------------------------------------------------------------------------
#: The CLI run in-process: kvtier(monkeypatch, capsys, *args) → (exit code, stdout, stderr).
kvtier = partial(run_cli, app)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--systems", "vllm,foo"], "unknown foo"),
        (["--systems", "ceiling,oracle"], "each system once"),  # oracle is the ceiling
        (["--concurrency", "1,x"], "--concurrency"),
        (["--num-prompts", "3"], "--num-prompts 3"),
        (["--quiet-load", "-1"], "--quiet-load"),
        (["--pool-blocks", "2"], "--pool-blocks 2"),
        (["--chunk-tokens", "100"], "--chunk-tokens"),
        (["--dram-size", "lots"], "lots"),
        (["--target", "--max-model-len", "2048"], "--max-model-len 2048"),
        (["--dir", "/proc/kvtier-nope"], "--dir"),
        (["--sessions", "--num-prompts", "18"], "multiple of --num-prefixes"),
        (["--sessions", "--concurrency", "1,8"], "at most --num-prefixes (4)"),
    ],
)
def test_bad_input_is_refused_before_any_server(monkeypatch, capsys, tmp_path, args, message):
    def no_run(self):
        raise AssertionError("a server would have started")

    monkeypatch.setattr(ServeBench, "run", no_run)
    code, out, err = kvtier(monkeypatch, capsys, "bench", "serve", "--dir", str(tmp_path), *args)
    assert code == 2, err
    assert message in err and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("missing", "args"),
    [("pandas", ["--sessions"]), ("vllm", []), ("transformers", ["--sessions"])],
)
def test_a_missing_package_is_refused_before_any_server(
    monkeypatch, capsys, tmp_path, missing, args
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a)
    )

    def no_run(self):
        raise AssertionError("a server would have started")

    monkeypatch.setattr(ServeBench, "run", no_run)
    code, out, err = kvtier(monkeypatch, capsys, "bench", "serve", "--dir", str(tmp_path), *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"needs the Python package '{missing}'" in err and "make setup-vllm" in err
    assert "kvtier[vllm]" not in err  # there is no such extra


def test_sigterm_ends_the_run_through_its_cleanup():
    import os
    import signal

    from kvtier.cli.bench_serve_cmd import _run_stopping_on_sigterm

    cleaned: list[bool] = []

    class Bench:
        def run(self):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                raise AssertionError("SIGTERM did not interrupt the run")
            finally:
                cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exc:
        _run_stopping_on_sigterm(Bench())
    assert exc.value.code == 128 + signal.SIGTERM and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before


# --- the preloading check --------------------------------------------------------------------
def _preload_result(on_waits, off_waits) -> PreloadResult:
    result = PreloadResult(PreloadWorkload(tokens=2112, hits=2))
    result.runs["preload"] = PreloadRun("preload", [0.5, 0.7], [3.0, 4.0], on_waits, 8192)
    result.runs["on-demand"] = PreloadRun("on-demand", [1.5, 2.5], [3.0, 4.0], off_waits, 8192)
    return result


def test_preload_result_compares_the_waits_and_the_hit_ttfts():
    result = _preload_result([0.02, 0.03], [0.25, 0.25])
    assert result.wait_share() == pytest.approx(0.1)
    assert result.ttft_p50_change() == pytest.approx(0.6 / 2.0)
    r = _report()
    r.preload = result
    target = {t.name: t for t in r.targets()}[
        "preloading: engine wait for KV after scheduling, preload / on demand"
    ]
    assert target.passed and "hit TTFT p50 600 vs 2000 ms" in target.detail
    r.preload = _preload_result([0.1], [0.25])
    assert [t.passed for t in r.targets()][-1] is False
    console = Console(record=True, width=220)
    console.print(serve_table(r))
    assert "preloading: 2 prompts of 2112 tokens" in console.export_text()
    assert json.loads(serve_json(r))["preload"]["wait_share"] == pytest.approx(0.4)


def test_preload_check_not_measured_when_a_side_failed_or_loaded_nothing():
    result = _preload_result([], [0.25])
    assert result.wait_share() is None  # nothing loaded with preloading: no claim
    failed = PreloadResult(PreloadWorkload(), error="vLLM did not start")
    r = _report()
    r.preload = failed
    target = r.targets()[-1]
    assert target.passed is None and "vLLM did not start" in target.detail


def test_preload_workload_pool_holds_two_requests_and_bad_shapes_are_refused():
    assert PreloadWorkload(tokens=2112).pool_blocks == 2 * 17
    with pytest.raises(ConfigError, match="preload check"):
        ServeBenchConfig(preload=PreloadWorkload(tokens=100))


def test_every_server_gets_the_same_engine_arguments():
    assert ServeBenchConfig(seed=3).engine_args() == ("--enable-prefix-caching", "--seed", "3")
    wide = ServeBenchConfig(max_batched_tokens=4608).engine_args()
    assert wide[-2:] == ("--max-num-batched-tokens", "4608")
    with pytest.raises(ConfigError, match="--max-num-batched-tokens"):
        ServeBenchConfig(max_batched_tokens=64)


def test_a_share_of_the_possible_gain_is_taken_against_the_ceiling():
    r = _report()
    assert r.share_of_gain("kvtier", 1) is None  # no ceiling run: no share
    ceiling = _runs({("ceiling", 1): 1000.0, ("ceiling", 4): 10000.0}, {})
    r.runs += ceiling
    assert r.share_of_gain("kvtier", 1) == pytest.approx((6000 - 1500) / (6000 - 1000))
    assert r.share_of_gain("ceiling", 1) == pytest.approx(1.0)
    assert r.share_of_gain("kvtier", 4) is None  # the ceiling gained nothing there
    shares = json.loads(serve_json(r))["ttft_p50_share_of_possible_gain"]
    assert shares["1"]["kvtier"] == pytest.approx(0.9)


def test_the_ceilings_pool_holds_every_token_of_the_run_and_tp_reaches_every_engine():
    config = ServeBenchConfig(
        systems=("vllm", "ceiling", "kvtier"), concurrency=(1, 4), tensor_parallel=3
    )
    p = config.prefix
    tokens = (
        p.num_prefixes * p.prefix_tokens + p.prompts * (p.suffix_tokens + p.output_tokens)
    ) * 2
    assert config.ceiling_pool() * 128 >= tokens > config.pool() * 128
    assert config.engine_args()[-2:] == ("--tensor-parallel-size", "3")
    assert config.engine_env() == {"OMP_NUM_THREADS": "1"}
    assert ServeBenchConfig().engine_env() == {}
    with pytest.raises(ConfigError, match="--tensor-parallel must be at least 1"):
        ServeBenchConfig(tensor_parallel=0)


def _timed(system: str, c: int, mean_ms: float, duration_s: float) -> RunResult:
    raw = json.loads(PREFIX_FILE.read_text())
    raw.update(median_ttft_ms=mean_ms, mean_ttft_ms=mean_ms, duration=duration_s)
    raw["ttfts"] = [mean_ms / 1e3 * (0.95 + 0.1 * i / 9) for i in range(10)]  # ±5 % spread
    result = ClientResult.from_dict(raw)
    return RunResult(system, "prefix_repetition", c, 0, 0, result, CacheCounters(), 1.0, "f")


def test_every_report_gives_the_share_of_the_gain_or_says_there_is_none():
    config = ServeBenchConfig(systems=("vllm", "ceiling", "kvtier"), concurrency=(1, 4))
    r = ServeReport(config, [], [], {}, {}, 0.0)
    r.runs = [
        _timed("vllm", 1, 6000.0, 100.0),
        _timed("ceiling", 1, 1000.0, 50.0),
        _timed("kvtier", 1, 1400.0, 52.0),
        _timed("vllm", 4, 5000.0, 80.0),
        _timed("ceiling", 4, 4950.0, 70.0),  # TTFT within noise: nothing to gain
        _timed("kvtier", 4, 5200.0, 80.5),
    ]
    assert r.share_of_gain("kvtier", 1, "mean") == pytest.approx(4600 / 5000)
    assert r.share_of_gain("kvtier", 1, "duration") == pytest.approx(48 / 50)
    assert r.nothing_to_gain(1) is False and r.nothing_to_gain(4) is True
    targets = {t.name: t for t in r.targets()}
    gain = targets["kvtier share of the possible gain (TTFT mean, duration), concurrency 1"]
    assert gain.passed and gain.measured == pytest.approx(0.92)
    flat = targets["nothing to gain at concurrency 4: kvtier / vLLM alone, TTFT mean and duration"]
    assert flat.passed is False and flat.measured == pytest.approx(5200 / 5000)
    doc = json.loads(serve_json(r))
    assert doc["share_of_possible_gain"]["duration"]["1"]["kvtier"] == pytest.approx(0.96)
    assert doc["nothing_to_gain"] == {"1": False, "4": True}
    console = Console(record=True, width=260)
    console.print(serve_table(r))
    text = console.export_text()
    assert "92 · 92" in text and "nothing to gain" in text


def test_a_gain_within_the_requests_spread_is_nothing_to_gain():
    config = ServeBenchConfig(systems=("vllm", "ceiling", "kvtier"), concurrency=(1,))
    r = ServeReport(config, [], [], {}, {}, 0.0)
    alone, top = _timed("vllm", 1, 5000.0, 80.0), _timed("ceiling", 1, 4700.0, 78.0)
    assert r.runs == [] and r.nothing_to_gain(1) is None  # no runs: not known
    r.runs = [alone, top]
    assert r.nothing_to_gain(1) is False  # 6 % faster, every request within ±5 %
    wide = json.loads(PREFIX_FILE.read_text())
    wide.update(mean_ttft_ms=4700.0, ttfts=[0.5, 9.0, 0.6, 8.0, 4.4, 5.7])
    r.runs = [alone, replace(top, client=ClientResult.from_dict(wide))]
    assert r.nothing_to_gain(1) is True  # the requests' spread covers the 6 %


def test_the_report_says_where_the_ceiling_also_widens_the_batch():
    prefix = PrefixWorkload(prefix_tokens=2048, suffix_tokens=64, num_prefixes=4, prompts=16)
    per = -(-prefix.request_tokens // 128)  # blocks of the longest request
    narrow = ServeBenchConfig(
        systems=("vllm", "ceiling", "kvtier"), concurrency=(1, 8), prefix=prefix
    )
    (caveat,) = narrow.ceiling_caveats()
    assert f"hold {narrow.pool() // per} of the longest" in caveat
    assert f"--pool-blocks {8 * per}" in caveat
    assert narrow.as_dict()["ceiling_caveats"] == [caveat]
    wide = replace(narrow, pool_blocks=8 * per)
    assert wide.ceiling_caveats() == []
    assert replace(narrow, systems=("vllm", "kvtier")).ceiling_caveats() == []


def test_a_ceiling_that_kept_no_more_kv_leaves_nothing_to_gain_whatever_its_ttft():
    config = ServeBenchConfig(systems=("vllm", "ceiling", "kvtier"), concurrency=(1,))
    r = ServeReport(config, [], [], {}, {}, 0.0)
    alone, top = _timed("vllm", 1, 5000.0, 80.0), _timed("ceiling", 1, 4500.0, 72.0)
    r.runs = [alone, top]
    assert r.nothing_to_gain(1) is False  # 10 % faster, no counters: a gain
    hits = CacheCounters(prompt_tokens=100_000.0, local_hits=50_000.0)
    same = replace(hits, local_hits=51_000.0)  # 1 % of the prompts more: the machine drifted
    r.runs = [replace(alone, cache=hits), replace(top, cache=same)]
    assert r.nothing_to_gain(1) is True
    more = replace(hits, local_hits=60_000.0)  # the ceiling kept what vLLM alone lost
    r.runs = [replace(alone, cache=hits), replace(top, cache=more)]
    assert r.nothing_to_gain(1) is False
    preempted = replace(hits, preemptions=3.0)  # vLLM alone recomputed preempted requests
    r.runs = [replace(alone, cache=preempted), replace(top, cache=same)]
    assert r.nothing_to_gain(1) is False
