"""`kvtier bench storage` end to end on the real memory and disk tiers, at tiny sizes.

The checks are about consistency (bytes moved, request counts, ordered percentiles, references
and ratios present, JSON shape, cleanup), never about speed.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest

from kvtier.bench.env import filesystem_of, supports_o_direct
from kvtier.bench.fio import fio_binary
from kvtier.bench.report import storage_json, storage_plot, storage_table
from kvtier.bench.storage import (
    BenchError,
    StorageBench,
    StorageBenchConfig,
    default_tier_urls,
    native_request_blocks,
    with_option,
)
from kvtier.errors import ConfigError
from kvtier.specs import KiB, MiB

BLOCK = 256 * KiB
BLOCKS = 8
HAS_FIO = fio_binary() is not None


def tiny_config(disk: Path, **kw) -> StorageBenchConfig:
    base = dict(
        tiers=("memory://?size=16MiB", f"file://{disk}?size=16MiB"),
        block_size=BLOCK,
        chunk_tokens=16,
        depths=(1, 2),
        data_size=BLOCKS * BLOCK,
        min_read_seconds=0.0,
        lookup_chunks=32,
        lookup_repeats=5,
    )
    return StorageBenchConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kvbench")


@pytest.fixture(scope="module")
def report(disk_dir):
    steps: list[str] = []
    bench = StorageBench(tiny_config(disk_dir), on_step=steps.append)
    result = bench.run()
    assert len(steps) == bench.steps()  # the progress bar ends full
    return result


def test_every_tier_op_and_depth_has_a_row(report):
    rows = {(m.tier, m.op, m.depth) for m in report.measurements}
    assert rows == {
        (t, op, d) for t in ("memory", "disk") for op in ("write", "read") for d in (1, 2)
    }
    drives = {m.tier: m.drive for m in report.measurements}
    assert drives == {"memory": "threads", "disk": "native"}  # the disk tier has its own depth


def test_bytes_moved_are_blocks_times_size_and_requests_add_up(report):
    for m in report.measurements:
        assert m.result.bytes == BLOCKS * BLOCK, m
        assert m.block_bytes == BLOCK
        if m.drive == "threads":
            assert m.request_blocks == 1
            assert m.result.requests == BLOCKS
        else:
            assert m.request_blocks == min(BLOCKS, native_request_blocks(m.depth, BLOCK, 16))
            assert m.result.requests == math.ceil(BLOCKS / m.request_blocks)
        assert m.result.latency.count == m.result.requests
        assert m.result.seconds > 0 and m.result.gbps > 0
        assert m.tokens_per_s == pytest.approx(m.result.bandwidth / BLOCK * 16)


def test_latency_percentiles_are_ordered(report):
    for m in report.measurements:
        lat = m.result.latency
        assert 0 < lat.p50 <= lat.p95 <= lat.p99 <= lat.max, m
    lk = report.lookup.latency
    assert 0 < lk.p50 <= lk.p95 <= lk.p99 <= lk.max


def test_memory_rows_compare_with_a_plain_copy(report):
    for m in report.measurements:
        if m.tier != "memory":
            continue
        assert m.reference is not None and m.reference.kind == "copy"
        assert m.reference.result.bytes == m.result.bytes
        assert m.ratio == pytest.approx(m.result.bandwidth / m.reference.result.bandwidth)
        assert m.target == (0.8 if m.op == "read" else None)
        assert m.verdict == (("PASS" if m.ratio >= 0.8 else "MISS") if m.op == "read" else None)


@pytest.mark.skipif(not HAS_FIO, reason="fio is not installed")
def test_disk_rows_compare_with_fio_doing_the_same_io(report, disk_dir):
    for m in report.measurements:
        if m.tier != "disk":
            continue
        ref = m.reference
        assert ref is not None and ref.kind == "fio", report.notes
        file_bytes = 4096 + BLOCK  # the tier's header page, then the page-padded payload
        assert f"--bs={file_bytes}" in ref.detail
        assert f"--directory={disk_dir}" in ref.detail
        assert "--sync=dsync" in ref.detail if m.op == "write" else "--sync" not in ref.detail
        if supports_o_direct(disk_dir):
            assert "--direct=1" in ref.detail
        assert ref.result.bytes == BLOCKS * file_bytes
        assert m.ratio is not None and m.ratio > 0
        assert m.target == {"read": 0.9, "write": 0.8}[m.op]
        assert m.verdict in ("PASS", "MISS")


def test_lookup_row_finds_the_whole_prefix(report):
    lk = report.lookup
    assert lk is not None
    assert lk.chunks == 32 and lk.tokens == 32 * 16 and lk.hit_chunks == 32
    assert lk.tiers == ("memory", "disk")
    assert lk.verdict in ("PASS", "MISS")


def test_json_is_complete_and_consistent(report):
    data = json.loads(storage_json(report))
    assert data["benchmark"] == "storage"
    assert data["config"]["block_bytes"] == BLOCK and data["config"]["blocks"] == BLOCKS
    assert len(data["results"]) == 8
    for row in data["results"]:
        assert row["bytes"] == BLOCKS * BLOCK
        lat = row["latency_s"]
        assert lat["p50"] <= lat["p95"] <= lat["p99"]
        assert row["gbps"] == pytest.approx(row["bytes"] / row["seconds"] / 1e9)
        if row["reference"] is not None:
            assert row["ratio"] == pytest.approx(row["gbps"] / row["reference"]["gbps"])
    assert data["lookup"]["hit_chunks"] == 32
    env = data["environment"]
    assert env["fio"].startswith("fio-") if HAS_FIO else env["fio"] is None
    assert env["o_direct"] in (True, False)


def test_table_and_plot_render(report, tmp_path):
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(storage_table(report))
    text = console.export_text()
    assert "memory" in text and "disk" in text and "lookup" in text
    png = storage_plot(report, tmp_path / "bench.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_bench_leaves_no_blocks_behind(report, disk_dir):
    assert list(disk_dir.iterdir()) == []


def test_threaded_drive_on_disk_and_no_fio(tmp_path):
    cfg = tiny_config(tmp_path, tiers=(f"file://{tmp_path}?size=16MiB",), drive="threads")
    cfg = StorageBenchConfig(**{**cfg.__dict__, "fio": False, "lookup": False, "depths": (3,)})
    rep = StorageBench(cfg).run()
    assert [m.drive for m in rep.measurements] == ["threads", "threads"]
    for m in rep.measurements:
        assert m.result.bytes == BLOCKS * BLOCK and m.result.requests == BLOCKS
        assert m.reference is None and m.ratio is None and m.verdict is None
    assert rep.lookup is None


def test_repeats_report_the_median_pass(tmp_path):
    cfg = tiny_config(tmp_path, tiers=("memory://?size=16MiB",), repeats=3, lookup=False)
    rep = StorageBench(cfg).run()
    for m in rep.measurements:
        assert len(m.samples_gbps) == 3
        assert m.result.gbps == pytest.approx(sorted(m.samples_gbps)[1])
        assert len(m.reference.samples_gbps) == 3


def test_requests_of_several_blocks_reach_the_copy_reference(tmp_path):
    cfg = tiny_config(tmp_path, tiers=("memory://?size=16MiB",), batch=4, lookup=False)
    rep = StorageBench(cfg).run()
    for m in rep.measurements:
        assert m.request_blocks == 4 and m.result.bytes == BLOCKS * BLOCK
        assert m.reference is not None and m.reference.result.bytes == BLOCKS * BLOCK


@pytest.mark.skipif(not HAS_FIO, reason="fio is not installed")
def test_disk_repeats_alternate_with_fio_and_clean_up(tmp_path):
    cfg = tiny_config(tmp_path, tiers=(f"file://{tmp_path}?size=16MiB",), repeats=2)
    cfg = StorageBenchConfig(**{**cfg.__dict__, "lookup": False, "depths": (2,)})
    rep = StorageBench(cfg).run()
    for m in rep.measurements:
        assert len(m.samples_gbps) == 2 and len(m.reference.samples_gbps) == 2
        assert m.reference.result.bytes == BLOCKS * (4096 + BLOCK)  # one round, like kvtier
    assert list(tmp_path.iterdir()) == []  # fio's files and the tier's folder are gone


@pytest.mark.slow
@pytest.mark.skipif(not HAS_FIO, reason="fio is not installed")
@pytest.mark.parametrize("scheme", ["file", "slab"])
def test_disk_passes_take_turns_with_fio_slice_by_slice(tmp_path, scheme):
    cfg = tiny_config(tmp_path, tiers=(f"{scheme}://{tmp_path}?size=16MiB",), repeats=1)
    cfg = StorageBenchConfig(
        **{**cfg.__dict__, "lookup": False, "depths": (1,), "batch": 1, "slices": 4}
    )
    rep = StorageBench(cfg).run()
    for m in rep.measurements:
        assert m.slices == 4 and m.as_dict()["slices"] == 4
        assert m.result.bytes == BLOCKS * BLOCK and m.result.requests == BLOCKS
        assert m.reference is not None and m.reference.kind == "fio"
        assert m.reference.result.bytes == BLOCKS * (4096 + BLOCK)  # the four slices' sum
        assert m.reference.result.requests == BLOCKS
        assert "one of 4 slices" in m.reference.detail
    assert list(tmp_path.iterdir()) == []  # every slice's fio files are gone


def test_native_requests_hold_the_blocks_the_row_reports(tmp_path):
    cfg = tiny_config(tmp_path, tiers=(f"slab://{tmp_path}?size=16MiB",), fio=False)
    cfg = StorageBenchConfig(**{**cfg.__dict__, "lookup": False, "depths": (1,), "batch": 3})
    rep = StorageBench(cfg).run()
    for m in rep.measurements:  # 8 blocks in requests of 3: two whole requests, not 3 of 2-3
        assert m.request_blocks == 3 and m.result.requests == 2
        assert m.result.bytes == 6 * BLOCK


def test_a_coded_tier_takes_turns_with_its_raw_twin(tmp_path):
    url = f"slab://{tmp_path}?size=16MiB&codec=kv"
    cfg = tiny_config(tmp_path, tiers=(url,), reference="raw", repeats=2)
    cfg = StorageBenchConfig(**{**cfg.__dict__, "lookup": False, "depths": (1, 2), "slices": 2})
    bench = StorageBench(cfg)
    rep = bench.run()
    assert len(rep.measurements) == 4
    for m in rep.measurements:
        ref = m.reference
        assert ref is not None and ref.kind == "raw" and "codec=raw" in ref.detail
        assert ref.result.bytes == m.result.bytes == BLOCKS * BLOCK  # the same blocks
        assert len(ref.samples_gbps) == 2 and m.ratio is not None
        assert m.target == 0.95 and m.verdict in ("PASS", "MISS")  # random bytes: ≥ 0.95
    assert any("codec=raw" in note for note in rep.notes)
    assert rep.as_dict()["config"]["reference"] == "raw"
    trips = rep.round_trips  # store + load of the same blocks, one per depth
    assert [(t.depth, t.target) for t in trips] == [(1, 0.95), (2, 0.95)]
    for t in trips:
        w, r = t.write, t.read
        assert (w.op, r.op, w.depth) == ("write", "read", r.depth)
        ours = 1 / (1 / w.result.gbps + 1 / r.result.gbps)
        assert t.gbps == pytest.approx(ours)
        assert t.ratio == pytest.approx(ours / t.reference_gbps)
        assert (f"{t.tier} store+load depth {t.depth}" in rep.missed) == (t.verdict == "MISS")
    assert [x["depth"] for x in rep.as_dict()["round_trips"]] == [1, 2]
    assert list(tmp_path.iterdir()) == []  # both namespaces' folders are gone
    with pytest.raises(ConfigError, match="no codec"):
        tiny_config(tmp_path, tiers=(f"slab://{tmp_path}?size=16MiB&codec=raw",), reference="raw")
    with pytest.raises(ConfigError, match="reference"):
        tiny_config(tmp_path, reference="zstd")


def test_a_disk_tier_and_its_raw_twin_swap_files_between_repeats(tmp_path, monkeypatch):
    """A disk is not as fast everywhere: the coded tier and its twin swap namespaces between
    repeats, each adopting the files the other wrote, so no new file appears after the first
    repeat and both sides use the same places on the disk."""
    import kvtier.bench.storage as storage

    opened: list[tuple[str, bytes]] = []

    def open_and_note(url: str, namespace: bytes):
        opened.append(("codec=raw" in url, namespace))
        return real_open(url, namespace)

    real_open = storage.open_tier
    monkeypatch.setattr(storage, "open_tier", open_and_note)
    url = f"slab://{tmp_path}?size=16MiB&codec=kv"
    cfg = tiny_config(tmp_path, tiers=(url,), reference="raw", repeats=4)
    cfg = StorageBenchConfig(**{**cfg.__dict__, "lookup": False, "depths": (1, 2)})
    files: list[frozenset[str]] = []

    def step(label: str) -> None:
        found = frozenset(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.slab"))
        if found and "#" in label:
            files.append(found)

    rep = StorageBench(cfg, on_step=step).run()
    assert len(files) >= 4 * 2 * 2
    assert len(set(files)) == 1  # the same slab files, whichever side wrote them
    assert len({f.split("/")[0] for f in files[0]}) == 2  # one namespace folder per side
    assert any("swapping files every repeat" in note for note in rep.notes)
    namespaces = {ns for _, ns in opened}
    assert len(namespaces) == 2
    for raw in (False, True):  # each side opened on both namespaces' files
        assert {ns for r, ns in opened if r == raw} == namespaces
    for m in rep.measurements:
        assert m.reference is not None and "swapping" in m.reference.detail
        assert len(m.reference.samples_gbps) == 4
    assert list(tmp_path.iterdir()) == []


def test_slices_cover_the_pass_in_whole_rounds():
    bench = StorageBench(StorageBenchConfig(tiers=("memory://?size=16MiB",), slices=8))
    assert bench._slices(100, 10) == [(0, 10), (10, 20), (20, 30), (30, 50), (50, 60),
                                      (60, 70), (70, 80), (80, 100)]  # fmt: skip
    assert bench._slices(30, 10) == [(0, 10), (10, 20), (20, 30)]  # at least a round each
    assert bench._slices(92, 45) == [(0, 45), (45, 92)]  # cut at whole rounds only
    assert bench._slices(5, 10) == [(0, 5)]
    with pytest.raises(ConfigError, match="slices"):
        StorageBenchConfig(tiers=("memory://?size=16MiB",), slices=0)


def test_too_small_tier_and_bad_options_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="size="):
        StorageBench(tiny_config(tmp_path, tiers=("memory://?size=1MiB",))).run()
    with pytest.raises(ConfigError, match="drive threads"):
        StorageBench(tiny_config(tmp_path, tiers=("memory://?size=16MiB",), drive="native")).run()
    with pytest.raises(ConfigError):
        tiny_config(tmp_path, depths=(0,))
    with pytest.raises(ConfigError):
        tiny_config(tmp_path, drive="fast")
    assert issubclass(BenchError, Exception)


def test_default_block_is_model_kv_bytes_times_chunk():
    cfg = StorageBenchConfig(tiers=("memory://?size=1GiB",), model="llama-3.1-8b")
    assert cfg.block_bytes == 131072 * 256 == 32 * MiB
    assert cfg.block_meta.dtype == "bf16" and cfg.block_meta.shape == (32, 2, 8, 256, 128)
    small = StorageBenchConfig(tiers=("memory://?size=1GiB",))
    assert small.block_bytes == 23040 * 256  # smollm2-135m: 5.6 MiB


def test_url_helpers(tmp_path):
    url = with_option(f"file://{tmp_path}?size=1GiB&depth=8", "depth", "4")
    assert url.startswith(f"file://{tmp_path}?") and "depth=4" in url and "depth=8" not in url
    assert "size=1GiB" in url
    mem, disk = default_tier_urls(tmp_path, 512 * MiB)
    assert mem.startswith("memory://?size=") and disk.startswith(f"slab://{tmp_path}?size=")
    assert native_request_blocks(4, 1 * MiB) == 128  # a 32k-token prefix of 256-token chunks
    assert native_request_blocks(1, 256 * KiB, 64) == 512
    assert native_request_blocks(16, int(5.6 * MiB)) == 32  # ~256 MiB, whole rounds of 16
    assert native_request_blocks(16, 32 * MiB) == 16  # at least one round at the depth


def test_o_direct_probe_matches_the_filesystem(tmp_path):
    if filesystem_of(tmp_path) in ("ext4", "xfs", "btrfs"):
        assert supports_o_direct(tmp_path) is True


@pytest.mark.skipif(filesystem_of(Path("/dev/shm")) != "tmpfs", reason="no tmpfs at /dev/shm")
def test_a_disk_tier_in_ram_is_called_out(tmp_path):
    shm = Path(tempfile.mkdtemp(prefix="kvtier-bench-test-", dir="/dev/shm"))
    try:
        cfg = tiny_config(shm, tiers=(f"file://{shm}?size=16MiB",), fio=False, lookup=False)
        cfg = StorageBenchConfig(**{**cfg.__dict__, "depths": (1,)})
        rep = StorageBench(cfg).run()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    assert rep.environment.filesystem == "tmpfs"
    assert any("lives in RAM" in note for note in rep.notes), rep.notes


def test_targets_cover_both_disk_layouts_from_256_kib():
    from kvtier.bench.results import target_for

    for scheme in ("file", "slab"):
        assert target_for(scheme, "read", 256 * 1024) == 0.9
        assert target_for(scheme, "write", 1 << 20) == 0.8
        assert target_for(scheme, "read", 128 * 1024) is None
    assert target_for("memory", "read", 256 * 1024) == 0.8
    assert target_for("memory", "write", 256 * 1024) is None
    # against the tier's raw twin: what the codec must buy on KV, and may cost on random bytes
    assert target_for("slab", "read", 1 << 20, "raw", "kv") == 1.25
    assert target_for("slab", "write", 1 << 20, "raw", "kv") is None
    assert target_for("memory", "write", 1 << 20, "raw", "random") == 0.95
    assert target_for("slab", "read", 128 * 1024, "raw", "kv") is None


def test_kv_payloads_are_the_embedded_models_blocks_only():
    from kvtier.bench.storage import StorageBenchConfig
    from kvtier.errors import ConfigError

    StorageBenchConfig(tiers=("memory://?size=64MiB",), payload="kv")  # the embedded model
    for bad in (
        {"payload": "kv", "model": "llama-3.1-8b"},
        {"payload": "kv", "block_size": 1 << 20},
        {"payload": "kv", "chunk_tokens": 128},
        {"payload": "zeros"},
    ):
        with pytest.raises(ConfigError):
            StorageBenchConfig(tiers=("memory://?size=64MiB",), **bad)
