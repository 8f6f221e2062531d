"""fio as the disk's floor in ``kvtier bench peers``: the same chunk sizes, counts and depths as the
disk systems move, on a file in the same folder.

Writes go with O_DIRECT and O_DSYNC (a durable write, as ``slab://`` makes by default); cold
reads with O_DIRECT; warm reads buffered after one untimed read of the same file, with fio's
cache invalidation off, so they come from the page cache. One chunk: fio's latency per block at
depth 1. A 32k-token prefix: the whole job (every chunk, io_uring at depth 8, the depth
``slab://`` reads a batch at) is one request; a round is one run. Throughput: ``depth``
synchronous jobs over the requests' chunks.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from kvtier.bench.fio import FioError, FioJob, fio_binary, parse_fio_json
from kvtier.bench.stats import LatencyStats, PassResult

PREFIX_DEPTH = 8


class FioReference:
    """fio jobs over chunks of ``chunk_bytes`` in ``directory`` (its files removed on close)."""

    name = "fio"

    def __init__(self, directory: Path, chunk_bytes: int):
        self.directory = directory
        self.chunk_bytes = chunk_bytes
        self.binary = fio_binary()
        self.jobs: list[FioJob] = []
        self.detail = (
            f"fio, {chunk_bytes}-byte blocks in {directory}: writes O_DIRECT+O_DSYNC, cold "
            "reads O_DIRECT, warm reads buffered from the page cache"
        )

    @property
    def available(self) -> bool:
        """Whether fio is installed."""
        return self.binary is not None

    def _job(self, op: str, blocks: int, depth: int, engine: str, name: str) -> FioJob:
        job = FioJob(
            directory=self.directory,
            op=op,  # type: ignore[arg-type]
            block_size=self.chunk_bytes,
            blocks=blocks,
            depth=depth,
            ioengine=engine,
            direct=True,
            filename=f"kvtier-peers-fio-{os.getpid()}-{name}",
            sync="dsync",
        )
        self.jobs.append(job)
        return job

    def _run(self, job: FioJob, warm: bool = False) -> PassResult:
        """One fio pass; ``warm``: buffered, the page cache kept (a first pass fills it)."""
        job.directory.mkdir(parents=True, exist_ok=True)
        args = job.args()
        if warm:
            args = [a if a != "--direct=1" else "--direct=0" for a in args] + ["--invalidate=0"]
        cmd = [str(self.binary), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise FioError(f"fio ran past 600 s: {' '.join(cmd)}") from None
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise FioError(f"fio exited with {proc.returncode}: {lines[-1] if lines else ''}")
        return parse_fio_json(proc.stdout, job.op)[0]

    def chunk(self, blocks: int) -> dict[str, LatencyStats]:
        """Per-chunk latency of ``blocks`` chunks at depth 1: write, cold read, warm read."""
        job = self._job("write", blocks, 1, "psync", "chunk")
        out = {"store": self._run(job).latency}
        out["retrieve"] = self._run(replace(job, op="read")).latency
        self._run(replace(job, op="read"), warm=True)  # fills the page cache
        out["retrieve_warm"] = self._run(replace(job, op="read"), warm=True).latency
        return out

    def prefix(self, chunks: int) -> dict[str, float]:
        """One prefix of ``chunks`` chunks as one request: seconds to write, read cold, warm."""
        job = self._job("write", chunks, PREFIX_DEPTH, "io_uring", "prefix")
        out = {"store": self._run(job).seconds}
        out["retrieve"] = self._run(replace(job, op="read")).seconds
        warm = replace(job, op="read", ioengine="psync", depth=1)
        self._run(warm, warm=True)
        out["retrieve_warm"] = self._run(warm, warm=True).seconds
        return out

    def throughput(self, chunks: int, depth: int) -> dict[str, PassResult]:
        """``chunks`` chunks at ``depth`` synchronous jobs: write, then cold read."""
        job = self._job("write", chunks, depth, "psync", f"tput-{depth}")
        return {"store": self._run(job), "retrieve": self._run(replace(job, op="read"))}

    def close(self) -> None:
        """Remove every file the jobs wrote."""
        for job in self.jobs:
            with contextlib.suppress(OSError):
                job.remove_files()
        self.jobs.clear()


__all__ = ["FioReference"]
