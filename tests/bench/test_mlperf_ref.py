"""MLPerf Storage's KV-cache benchmark as the reference of ``kvtier bench mlperf``: its result
files are read, a wrong tool is refused, and where the benchmark is next to the project
(``../shared/tools/mlperf-kv-cache``), a short run of both sides on one directory works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.bench.mlperf_ref import (
    MlperfError,
    MlperfWorkload,
    check_tool,
    objects_of,
    read_figures,
    replay_ops,
)
from kvtier.errors import ConfigError

TOOL = Path(__file__).resolve().parents[3] / "shared/tools/mlperf-kv-cache/kv-cache.py"


def _result(path: Path, **stats) -> Path:
    cache = {
        "read_iops": 10,
        "total_read_bytes": 10 * 2**20,
        "storage_read_p50_ms": 2.0,
        "storage_read_p95_ms": 5.0,
        "total_write_bytes": 4 * 2**20,
    } | stats
    path.write_text(json.dumps({"summary": {"cache_stats": cache, "total_storage_io_time": 0.1}}))
    return path


def test_a_result_file_gives_the_read_figures(tmp_path):
    figures = read_figures(_result(tmp_path / "r.json"))
    assert figures.reads == 10 and figures.mean_read_bytes == 2**20
    assert figures.read_gbps_p50 == pytest.approx(2**20 / 2e-3 / 1e9)


def test_a_result_without_storage_figures_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": {}}))
    with pytest.raises(MlperfError, match=r"not a kv-cache\.py result"):
        read_figures(bad)


def test_the_objects_left_behind_are_written_and_read_back_as_often(tmp_path):
    for i, size in enumerate((300, 100, 200)):
        (tmp_path / f"conv_{i}.npy").write_bytes(b"x" * size)
        os.utime(tmp_path / f"conv_{i}.npy", ns=(10**9 * (i + 1), 10**9 * (i + 1)))
    objects = objects_of(tmp_path)
    assert objects == [("conv_0", 300), ("conv_1", 100), ("conv_2", 200)]
    ops = replay_ops(objects, reads=7)
    assert [(o.op, o.key) for o in ops[:4]] == [("write", "conv_0")] + [("read", "conv_0")] * 3
    assert sum(o.op == "read" for o in ops) == 7 and sum(o.op == "write" for o in ops) == 3
    with pytest.raises(MlperfError):
        replay_ops([], reads=3)


def test_only_kv_cache_py_is_taken_as_the_tool(tmp_path):
    other = tmp_path / "bench.py"
    other.write_text("")
    with pytest.raises(ConfigError, match=r"kv-cache\.py"):
        check_tool(other)
    with pytest.raises(ConfigError):
        MlperfWorkload(users=0)


@pytest.mark.slow
def test_both_sides_run_on_one_directory(tmp_path):
    if not TOOL.is_file():
        pytest.skip(f"MLPerf's kv-cache.py is not at {TOOL}")
    script = shutil.which("kvtier", path=str(Path(sys.executable).parent)) or "kvtier"
    cmd = [script, "bench", "mlperf", "--tool", str(TOOL)]
    cmd += ["--dir", str(tmp_path / "disk"), "--duration", "2", "--max-requests", "4"]
    cmd += ["--users", "1", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert figures["reference"]["reads"] > 0 and figures["kvtier"]["reads"] > 0
    assert figures["kvtier"]["hit_rate"] == 1.0
    assert figures["read_ratio"] > 0
    assert list((tmp_path / "disk").iterdir()) == []  # both sides' files are removed
