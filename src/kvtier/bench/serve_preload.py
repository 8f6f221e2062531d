"""The preloading check of ``kvtier bench serve``: a queued workload served from disk, with
kvtier's preloading on and off (loading on demand), one server each.

The KV of ``hits`` prompts is computed once by a filling server and written to a disk tier; the
server stops. Each system then starts on a copy of that disk tier and an empty host-memory tier
and gets, all at once, the hit prompts interleaved with as many cold prompts of the same length:
the cold ones keep the engine busy and vLLM's KV pool holds two requests, so the hit prompts
wait in vLLM's queue — time preloading uses to move their KV up to host memory. Measured from
the connector's per-request records: the engine's wait for KV after a request is scheduled
(``load_wait_s``: from its blocks being allocated to its KV being in them), and each request's
time to its first token.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.bench.serve_config import PreloadWorkload, kvtier_transfer_config
from kvtier.engines.vllm.records import read_records
from kvtier.harness.vllm_server import BLOCK_TOKENS, ServerConfig, VllmServer

#: The two systems: preloading on (the connector's default) and off.
PRELOAD_SYSTEMS = ("preload", "on-demand")


@dataclass(frozen=True)
class PreloadRun:
    """One system's queued run: TTFT (s) of the hit and cold prompts, the connector's wait for
    KV per loaded request, and where the loaded tokens came from."""

    system: str
    hit_ttft_s: list[float]
    cold_ttft_s: list[float]
    load_waits_s: list[float]
    loaded_tokens: int
    hit_tokens: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def wait_s(self) -> float:
        return float(sum(self.load_waits_s))

    @property
    def hit_ttft_p50_s(self) -> float | None:
        return statistics.median(self.hit_ttft_s) if self.hit_ttft_s else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "wait_s": self.wait_s, "hit_ttft_p50_s": self.hit_ttft_p50_s}


@dataclass
class PreloadResult:
    """Both systems' runs, the filling server's seconds, and what failed (None: nothing)."""

    workload: PreloadWorkload
    runs: dict[str, PreloadRun] = field(default_factory=dict)
    fill_s: float = 0.0
    error: str | None = None

    def wait_share(self) -> float | None:
        """The wait for KV with preloading over the wait on demand (None: not measured)."""
        on, off = self.runs.get("preload"), self.runs.get("on-demand")
        if on is None or off is None or off.wait_s <= 0 or not on.load_waits_s:
            return None
        return on.wait_s / off.wait_s

    def ttft_p50_change(self) -> float | None:
        """Hit prompts' TTFT p50 with preloading over on demand (None: not measured)."""
        on, off = self.runs.get("preload"), self.runs.get("on-demand")
        a = on.hit_ttft_p50_s if on else None
        b = off.hit_ttft_p50_s if off else None
        return None if a is None or b is None or b <= 0 else a / b

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": asdict(self.workload),
            "runs": {k: r.as_dict() for k, r in self.runs.items()},
            "fill_s": self.fill_s,
            "wait_share": self.wait_share(),
            "hit_ttft_p50_change": self.ttft_p50_change(),
            "error": self.error,
        }


class PreloadCheck:
    """Runs the check in ``run_dir`` with host-memory tiers under ``shm_dir``."""

    def __init__(
        self,
        workload: PreloadWorkload,
        run_dir: Path,
        shm_dir: Path,
        post: Callable[[str, str, list[int], float], float],
        on_step: Callable[[str], None] = lambda label: None,
        startup_timeout_s: float = 600.0,
    ):
        self.workload = workload
        self.run_dir = run_dir / "preload"
        self.shm_dir = shm_dir
        self.post = post
        self.on_step = on_step
        self.startup_timeout_s = startup_timeout_s

    def _prompts(self, vocab: tuple[int, int]) -> tuple[list[list[int]], list[list[int]]]:
        w = self.workload
        rng = np.random.default_rng([w.seed, 4099])

        def draw() -> list[int]:
            return [int(t) for t in rng.integers(vocab[0], vocab[1], w.tokens)]

        return [draw() for _ in range(w.hits)], [draw() for _ in range(w.hits)]

    def _server(self, folder: Path, system: str, shm: Path, disk: Path) -> VllmServer:
        w = self.workload
        # generous, fp32 KV included: both tiers hold every prompt
        size = 2 * w.hits * w.tokens * 64 * 1024
        records = self.run_dir / f"{system}-records.jsonl"
        kv = kvtier_transfer_config(
            [
                f"slab://{shm}?size={size >> 20}MiB&name=dram",
                f"slab://{disk}?size={2 * size >> 20}MiB&name=disk",
            ],
            w.chunk_tokens,
            records,
        )
        kv["kv_connector_extra_config"]["preload"] = system != "on-demand"
        config = ServerConfig(
            model=folder,
            max_model_len=-(-(w.tokens + 1) // BLOCK_TOKENS) * BLOCK_TOKENS,
            pool_blocks=w.pool_blocks,
            kv_transfer_config=kv,
            request_details=False,
            extra_args=("--enable-prefix-caching", "--seed", str(w.seed)),
            startup_timeout_s=self.startup_timeout_s,
        )
        return VllmServer(config, self.run_dir / f"vllm-{system}.log")

    def run(self, folder: Path, vocab: tuple[int, int]) -> PreloadResult:
        """Fill the disk tier, then run each system on a copy of it."""
        result = PreloadResult(self.workload)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        hits, colds = self._prompts(vocab)
        filled = self.run_dir / "filled"
        shms: list[Path] = []
        try:
            self.on_step("preload check: filling the disk tier")
            shm = self.shm_dir / f"kvtier-preload-{self.run_dir.parent.name}-fill"
            shms.append(shm)
            began = time.perf_counter()
            with self._server(folder, "fill", shm, filled) as server:
                for prompt in hits:
                    self.post(server.base_url, server.model_name, prompt, 600)
                time.sleep(2.0)  # the last chunks' stores drain before the server stops
            result.fill_s = time.perf_counter() - began
            for system in PRELOAD_SYSTEMS:
                self.on_step(f"preload check: {system}")
                disk = self.run_dir / f"{system}-data"
                shutil.rmtree(disk, ignore_errors=True)
                shutil.copytree(filled, disk)
                shm = self.shm_dir / f"kvtier-preload-{self.run_dir.parent.name}-{system}"
                shms.append(shm)
                result.runs[system] = self._queued(folder, system, shm, disk, hits, colds)
        except Exception as exc:  # a failed check is reported, never a failed benchmark
            result.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        finally:
            for path in shms:
                shutil.rmtree(path, ignore_errors=True)
        return result

    def _queued(
        self,
        folder: Path,
        system: str,
        shm: Path,
        disk: Path,
        hits: list[list[int]],
        colds: list[list[int]],
    ) -> PreloadRun:
        order = [
            x
            for pair in zip([("cold", p) for p in colds], [("hit", p) for p in hits], strict=True)
            for x in pair
        ]
        records = self.run_dir / f"{system}-records.jsonl"
        with self._server(folder, system, shm, disk) as server:
            self.post(server.base_url, server.model_name, [vocab_id(hits)] * 16, 600)
            seen = len(read_records(records))
            began = time.perf_counter()
            with ThreadPoolExecutor(len(order)) as pool:
                futures = []
                for _, prompt in order:  # in this order: arrivals a few ms apart
                    futures.append(
                        pool.submit(self.post, server.base_url, server.model_name, prompt, 900)
                    )
                    time.sleep(0.02)
                ttfts = [f.result() for f in futures]
            wall = time.perf_counter() - began
            time.sleep(1.0)  # the last requests' records are written when they finish
            mine = read_records(records)[seen:]
        hit_t = [t for (kind, _), t in zip(order, ttfts, strict=True) if kind == "hit"]
        cold_t = [t for (kind, _), t in zip(order, ttfts, strict=True) if kind == "cold"]
        waits = [float(r.get("load_wait_s") or 0.0) for r in mine if r.get("loaded_tokens")]
        tiers: dict[str, float] = {}
        for r in mine:
            for tier, tokens in (r.get("hit_tokens") or {}).items():
                tiers[tier] = tiers.get(tier, 0.0) + float(tokens)
        loaded = int(sum(float(r.get("loaded_tokens") or 0) for r in mine))
        return PreloadRun(system, hit_t, cold_t, waits, loaded, tiers, wall)


def vocab_id(prompts: list[list[int]]) -> int:
    """A token id for the warm-up prompt (one the prompts use)."""
    return prompts[0][0] if prompts and prompts[0] else 1000


__all__ = ["PRELOAD_SYSTEMS", "PreloadCheck", "PreloadResult", "PreloadRun"]
