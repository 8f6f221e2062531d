"""fio job building and JSON parsing, checked against real fio runs (skipped without fio)."""

from __future__ import annotations

import json

import pytest

from kvtier.bench.env import supports_o_direct
from kvtier.bench.fio import FioError, FioJob, fio_binary, parse_fio_json, run_fio
from kvtier.specs import KiB

needs_fio = pytest.mark.skipif(fio_binary() is None, reason="fio is not installed")


def test_depth_maps_to_iodepth_for_async_and_to_jobs_for_sync_engines(tmp_path):
    uring = FioJob(tmp_path, "read", 64 * KiB, 10, depth=4, ioengine="io_uring")
    psync = FioJob(tmp_path, "read", 64 * KiB, 10, depth=4, ioengine="psync")
    assert (uring.jobs, uring.iodepth) == (1, 4)
    assert (psync.jobs, psync.iodepth) == (4, 1)
    # every job gets whole blocks, and together they cover every block
    assert psync.bytes_per_job % psync.block_size == 0
    assert psync.file_size >= 10 * 64 * KiB
    assert "--offset_increment=196608" in psync.args()


def test_o_direct_job_refuses_unaligned_blocks(tmp_path):
    with pytest.raises(FioError, match="multiple of 512"):
        FioJob(tmp_path, "read", 1000, 4, direct=True)


def test_parser_rejects_non_json_and_failed_jobs():
    with pytest.raises(FioError, match="no JSON"):
        parse_fio_json("fio: engine io_uring not loadable", "read")
    failed = {"fio version": "fio-x", "jobs": [{"jobname": "kvtier", "error": 5}]}
    with pytest.raises(FioError, match="error 5"):
        parse_fio_json(json.dumps(failed), "read")
    with pytest.raises(FioError, match="no jobs"):
        parse_fio_json('{"jobs": []}', "read")


@needs_fio
@pytest.mark.parametrize("engine,depth", [("psync", 2), ("io_uring", 4)])
def test_real_fio_write_then_read_is_parsed(tmp_path, engine, depth):
    direct = supports_o_direct(tmp_path)
    blocks, bs = 16, 256 * KiB
    write = run_fio(FioJob(tmp_path, "write", bs, blocks, depth, engine, direct))
    assert write.version and write.version.startswith("fio-")
    w = write.result
    assert w.bytes == blocks * bs  # a size-based pass moves exactly its blocks
    assert w.requests == blocks
    assert w.seconds > 0 and w.bandwidth > 0
    lat = w.latency
    assert 0 < lat.p50 <= lat.p95 <= lat.p99 <= lat.max * 1.02  # fio buckets percentiles
    assert (tmp_path / "kvtier-fio.dat").stat().st_size == blocks * bs

    read = run_fio(FioJob(tmp_path, "read", bs, blocks, depth, engine, direct, min_seconds=0.05))
    r = read.result
    assert r.bytes > 0 and r.bytes % bs == 0  # time-based: whole blocks until the time is up
    assert r.requests == r.bytes // bs
    assert 0 < r.latency.p50 <= r.latency.p95 <= r.latency.p99


@needs_fio
def test_per_block_layout_makes_one_file_per_block(tmp_path):
    job = FioJob(tmp_path, "write", 64 * KiB, 6, depth=2, ioengine="psync", layout="per-block")
    res = run_fio(job)
    assert res.result.bytes == 6 * 64 * KiB and res.result.requests == 6
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(p.name for p in job.paths()) and len(files) == 6
    assert all(p.stat().st_size == 64 * KiB for p in job.paths())
    read = run_fio(FioJob(tmp_path, "read", 64 * KiB, 6, 2, "psync", layout="per-block", loops=2))
    assert read.result.bytes == 2 * 6 * 64 * KiB and read.result.requests == 12
    job.remove_files()
    assert list(tmp_path.iterdir()) == []


@needs_fio
def test_parser_skips_warnings_before_the_json(tmp_path):
    job = FioJob(tmp_path, "write", 64 * KiB, 4, 1, "psync", direct=False)
    res = run_fio(job)
    text = "fio: some warning\n" + json.dumps(
        {
            "fio version": res.version,
            "jobs": [
                {
                    "jobname": "kvtier",
                    "error": 0,
                    "write": {
                        "io_bytes": 4096,
                        "runtime": 2,
                        "total_ios": 1,
                        "lat_ns": {
                            "mean": 1000.0,
                            "max": 2000.0,
                            "percentile": {"50.000000": 900, "95.000000": 1500, "99.000000": 1900},
                        },
                        "clat_ns": {"mean": 1.0, "max": 1.0},
                    },
                }
            ],
        }
    )
    parsed, version = parse_fio_json(text, "write")
    assert version == res.version
    assert parsed.bytes == 4096 and parsed.seconds == pytest.approx(0.002)
    assert parsed.latency.p50 == pytest.approx(900e-9)
    assert parsed.latency.p99 == pytest.approx(1900e-9)


@needs_fio
def test_fio_failure_is_a_typed_error(tmp_path):
    missing = tmp_path / "file-not-dir"
    missing.write_text("x")
    with pytest.raises(FioError, match="cannot use"):
        run_fio(FioJob(missing, "read", 64 * KiB, 4, 1, "psync", direct=False))
    with pytest.raises(FioError, match="exited"):
        run_fio(FioJob(tmp_path, "read", 64 * KiB, 4, 1, "no-such-engine", direct=False))
