"""fio as the physical reference: build a job that mirrors a kvtier pass, run it, parse its JSON.

A depth of N maps to ``iodepth=N`` for asynchronous engines (io_uring, libaio) and to N jobs
(threads) of ``iodepth=1`` for synchronous ones (psync, sync, pvsync2), each job on its own
region of one shared file, reported as one group.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvtier.bench.stats import LatencyStats, PassResult
from kvtier.errors import KvtierError

ASYNC_ENGINES = frozenset({"io_uring", "libaio", "posixaio"})
Op = Literal["read", "write"]


class FioError(KvtierError):
    """fio is missing, failed, or wrote output this parser cannot read."""


def fio_binary() -> str | None:
    """Path of the ``fio`` executable, or None when it is not installed."""
    return shutil.which("fio")


def fio_version(binary: str | None = None) -> str | None:
    """``fio --version`` (e.g. ``fio-3.33``), or None when fio is not installed."""
    binary = binary or fio_binary()
    if binary is None:
        return None
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


@dataclass(frozen=True)
class FioJob:
    """One fio pass over ``blocks`` blocks of ``block_size`` bytes in ``directory``.

    ``layout="file"``: every job works on its own region of one file, ``directory/filename``.
    ``layout="per-block"``: one file of ``block_size`` bytes per block (``filename.<job>.<n>``),
    visited in order, the way a tier that stores one file per block lays its data out.
    ``loops`` repeats the pass over the same blocks; ``min_seconds`` > 0 makes it time-based
    instead (fio stops issuing at that time; I/Os cut short are not counted). ``sync`` opens
    the files for writes with O_SYNC or O_DSYNC, as a tier that makes every block durable does.
    """

    directory: Path
    op: Op
    block_size: int
    blocks: int
    depth: int = 1
    ioengine: str = "io_uring"
    direct: bool = True
    filename: str = "kvtier-fio.dat"
    min_seconds: float = 0.0
    sync: str = "none"  # writes: "none", "sync" (O_SYNC) or "dsync" (O_DSYNC)
    layout: Literal["file", "per-block"] = "file"
    loops: int = 1

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.blocks <= 0 or self.depth <= 0:
            raise FioError("fio job needs positive block size, block count and depth")
        if self.direct and self.block_size % 512:
            raise FioError(
                f"O_DIRECT needs a block size that is a multiple of 512 B, got {self.block_size}"
            )
        if self.loops < 1:
            raise FioError(f"fio loops must be at least 1, got {self.loops}")
        if self.layout not in ("file", "per-block"):
            raise FioError(f"unknown fio layout {self.layout!r}; use file or per-block")
        if not self.filename or "/" in self.filename or ":" in self.filename:
            raise FioError(f"fio file name {self.filename!r} must be a plain name")

    @property
    def jobs(self) -> int:
        """fio jobs (threads): 1 for async engines, ``depth`` for synchronous ones."""
        return 1 if self.ioengine in ASYNC_ENGINES else min(self.depth, self.blocks)

    @property
    def iodepth(self) -> int:
        """I/Os in flight per job."""
        return self.depth if self.ioengine in ASYNC_ENGINES else 1

    @property
    def blocks_per_job(self) -> int:
        """Blocks each job covers (whole blocks; the jobs together cover every block)."""
        return math.ceil(self.blocks / self.jobs)

    @property
    def bytes_per_job(self) -> int:
        """Bytes each job covers."""
        return self.blocks_per_job * self.block_size

    @property
    def file_size(self) -> int:
        """Bytes the data spans once every job has written its blocks."""
        return self.bytes_per_job * self.jobs

    def paths(self) -> list[Path]:
        """The files this job reads or writes."""
        if self.layout == "file":
            return [self.directory / self.filename]
        return [
            self.directory / f"{self.filename}.{j}.{n}"
            for j in range(self.jobs)
            for n in range(self.blocks_per_job)
        ]

    def remove_files(self) -> None:
        """Delete the job's files (missing ones are fine)."""
        for path in self.paths():
            path.unlink(missing_ok=True)

    def args(self) -> list[str]:
        """fio command-line arguments (without the binary)."""
        if self.layout == "file":
            where = [
                "--name=kvtier",
                f"--directory={self.directory}",  # before --filename, which it anchors
                f"--filename={self.filename}",
                f"--offset_increment={self.bytes_per_job}",
            ]
        else:
            where = [
                f"--name={self.filename}",
                f"--directory={self.directory}",
                f"--nrfiles={self.blocks_per_job}",
                f"--filesize={self.block_size}",
                "--file_service_type=sequential",
            ]
        args = [
            *where,
            "--thread",
            f"--rw={self.op}",
            f"--bs={self.block_size}",
            f"--size={self.bytes_per_job}",
            f"--numjobs={self.jobs}",
            f"--iodepth={self.iodepth}",
            f"--ioengine={self.ioengine}",
            f"--direct={int(self.direct)}",
            "--group_reporting",
            "--lat_percentiles=1",
            "--percentile_list=50:95:99",
            "--output-format=json",
        ]
        if self.loops > 1:
            args.append(f"--loops={self.loops}")
        if self.min_seconds > 0:
            args += ["--time_based", f"--runtime={max(1, round(self.min_seconds * 1000))}ms"]
        if self.sync != "none" and self.op == "write":
            args.append(f"--sync={self.sync}")
        return args


@dataclass(frozen=True)
class FioResult:
    """What fio measured for one pass, plus the command that produced it."""

    op: Op
    result: PassResult
    version: str | None
    command: list[str]

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "op": self.op,
            **self.result.as_dict(),
            "version": self.version,
            "command": " ".join(self.command),
        }


def parse_fio_json(text: str, op: Op) -> tuple[PassResult, str | None]:
    """The pass result of ``op`` from fio's ``--output-format=json`` text (group-reported).

    fio may print warnings before the JSON document; they are skipped. Latency is fio's total
    latency (submission + completion) when ``lat_percentiles`` was on, else completion latency.
    """
    start = text.find("{")
    if start < 0:
        raise FioError(f"fio printed no JSON: {text.strip()[:200]!r}")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
        jobs = doc["jobs"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise FioError(
            f"cannot read fio JSON output ({exc}); was it --output-format=json?"
        ) from None
    if not jobs:
        raise FioError("fio JSON holds no jobs")
    total_bytes, total_ios, runtime_ms = 0, 0, 0.0
    weighted = {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    lat_max = 0.0
    for job in jobs:
        if job.get("error"):
            raise FioError(f"fio job {job.get('jobname')!r} failed with error {job['error']}")
        try:
            side = job[op]
            ios = int(side["total_ios"])
            total_bytes += int(side["io_bytes"])
            runtime_ms = max(runtime_ms, float(side["runtime"]))
            lat = side["lat_ns"] if "percentile" in side.get("lat_ns", {}) else side["clat_ns"]
            pct = lat.get("percentile", {})
        except (KeyError, TypeError, ValueError) as exc:
            raise FioError(f"fio JSON lacks the {op} section field {exc}") from None
        total_ios += ios
        weighted["mean"] += float(lat.get("mean", 0.0)) * ios
        for name, key in (("p50", "50.000000"), ("p95", "95.000000"), ("p99", "99.000000")):
            weighted[name] += float(pct.get(key, lat.get("mean", 0.0))) * ios
        lat_max = max(lat_max, float(lat.get("max", 0.0)))
    if total_ios == 0 or runtime_ms <= 0:
        raise FioError(f"fio moved no {op} data; check the directory and the size")
    ns = {k: v / total_ios / 1e9 for k, v in weighted.items()}
    latency = LatencyStats(total_ios, ns["mean"], ns["p50"], ns["p95"], ns["p99"], lat_max / 1e9)
    return PassResult(total_bytes, runtime_ms / 1e3, total_ios, latency), doc.get("fio version")


def run_fio(job: FioJob, binary: str | None = None, timeout_s: float = 600.0) -> FioResult:
    """Run one fio pass and parse it. Raises FioError when fio is missing or fails."""
    binary = binary or fio_binary()
    if binary is None:
        raise FioError("fio is not installed; install it (apt-get install fio) or pass --no-fio")
    try:
        job.directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FioError(f"cannot use {job.directory} for fio: {exc.strerror}") from None
    cmd = [binary, *job.args()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise FioError(f"fio ran past {timeout_s:.0f} s: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise FioError(f"fio exited with {proc.returncode}: {msg[-1] if msg else 'no output'}")
    result, version = parse_fio_json(proc.stdout, job.op)
    return FioResult(job.op, result, version, cmd)
