"""MLPerf Storage's KV-cache benchmark run as the reference of ``kvtier bench mlperf``.

The benchmark (``kv-cache.py``, not part of kvtier: its path is given) runs with its own file
backend on a directory of the disk under test (``np.save`` + ``fsync`` per object, page cache
dropped before each ``np.load``); its result file gives the reference figures, and the objects
it left in the directory give kvtier's workload: the same objects (one request's whole KV each),
each written once and read back right after as often as the benchmark read an object on average.
(The benchmark's own trace mode, ``--io-trace-log``, does no I/O, so its users run ahead and
make other, larger objects than a run that does.) Each read is compared as bytes over the time
to bring one object back: the benchmark's read latencies include its copy into a new array,
kvtier's the lookup and the load into host buffers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from kvtier.errors import ConfigError, KvtierError
from kvtier.workloads.mlperf import TraceOp


class MlperfError(KvtierError):
    """The benchmark did not run or wrote no usable result."""


@dataclass(frozen=True)
class MlperfWorkload:
    """The benchmark's workload options, the same for the trace and for the reference run."""

    model: str = "tiny-1b"
    users: int = 4
    duration_s: int = 15
    max_requests: int = 40
    seed: int = 1

    def __post_init__(self) -> None:
        if min(self.users, self.duration_s, self.max_requests) < 1:
            raise ConfigError("users, duration and max requests must be at least 1")

    def args(self) -> list[str]:
        """The benchmark's command-line options for this workload (no CPU or GPU tier)."""
        return [
            "--model",
            self.model,
            "--num-users",
            str(self.users),
            "--duration",
            str(self.duration_s),
            "--max-requests",
            str(self.max_requests),
            "--seed",
            str(self.seed),
            "--gpu-mem-gb",
            "0",
            "--cpu-mem-gb",
            "0",
            "--generation-mode",
            "none",
        ]


@dataclass(frozen=True)
class MlperfFigures:
    """What the benchmark's file backend measured: storage reads and writes."""

    reads: int
    read_bytes: int
    read_p50_ms: float
    read_p95_ms: float
    write_bytes: int
    io_seconds: float  # the benchmark's total storage I/O time (reads and writes)

    @property
    def mean_read_bytes(self) -> float:
        return self.read_bytes / self.reads if self.reads else 0.0

    @property
    def read_gbps_p50(self) -> float:
        """Bytes of an average object over the median read latency (decimal GB/s)."""
        return self.mean_read_bytes / (self.read_p50_ms / 1e3) / 1e9 if self.read_p50_ms else 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"read_gbps_p50": self.read_gbps_p50}


def check_tool(tool: Path) -> Path:
    """The benchmark's ``kv-cache.py`` (refused when it is not there)."""
    tool = Path(tool)
    if not tool.is_file() or tool.name != "kv-cache.py":
        raise ConfigError(
            f"{tool} is not MLPerf Storage's kv-cache.py; give its path with --tool "
            "(e.g. ../shared/tools/mlperf-kv-cache/kv-cache.py)"
        )
    return tool.resolve()


def _run(tool: Path, args: list[str], log: Path) -> None:
    cmd = [sys.executable, str(tool), *args]
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=tool.parent, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise MlperfError(f"kv-cache.py exited with {proc.returncode}: {tail[0][:200]} ({log})")


def objects_of(directory: Path) -> list[tuple[str, int]]:
    """(key, bytes) of the objects the file backend left in ``directory``, oldest first."""
    files = sorted(Path(directory).glob("*.npy"), key=lambda f: (f.stat().st_mtime_ns, f.name))
    return [(f.stem, f.stat().st_size) for f in files]


def replay_ops(objects: list[tuple[str, int]], reads: int) -> list[TraceOp]:
    """Each object written, then read back ``reads / len(objects)`` times on average (the
    remainder spread over the first ones)."""
    if not objects:
        raise MlperfError("the benchmark's file backend left no objects to replay")
    per, extra = divmod(max(reads, len(objects)), len(objects))
    ops: list[TraceOp] = []
    for i, (key, size) in enumerate(objects):
        ops.append(TraceOp(float(i), "write", size, "Tier-2", key, "Prefill"))
        for _ in range(per + (i < extra)):
            ops.append(TraceOp(float(i), "read", size, "Tier-2", key, "Decode"))
    return ops


def run_file_backend(tool: Path, workload: MlperfWorkload, directory: Path, work: Path):
    """Run ``workload`` on the benchmark's own file backend in ``directory``; its figures."""
    out = work / "reference.json"
    _run(
        tool,
        [*workload.args(), "--cache-dir", str(directory), "--output", str(out)],
        work / "reference.log",
    )
    return read_figures(out)


def read_figures(path: Path) -> MlperfFigures:
    """The storage figures of a benchmark result file."""
    try:
        summary = json.loads(Path(path).read_text())["summary"]
        stats = summary["cache_stats"]
        return MlperfFigures(
            reads=int(stats["read_iops"]),
            read_bytes=int(stats["total_read_bytes"]),
            read_p50_ms=float(stats["storage_read_p50_ms"]),
            read_p95_ms=float(stats["storage_read_p95_ms"]),
            write_bytes=int(stats["total_write_bytes"]),
            io_seconds=float(summary["total_storage_io_time"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MlperfError(
            f"{path} is not a kv-cache.py result with storage figures: {exc}"
        ) from None


__all__ = [
    "MlperfError",
    "MlperfFigures",
    "MlperfWorkload",
    "check_tool",
    "objects_of",
    "read_figures",
    "replay_ops",
    "run_file_backend",
]
