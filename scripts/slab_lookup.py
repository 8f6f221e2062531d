"""Lookup latency of a process reading ``slab://`` tiers another live process keeps writing: the
vLLM connector's case (the Worker stores, the EngineCore looks up on vLLM's scheduling path).

    .venv/bin/python scripts/slab_lookup.py --fill 50,400 [--dir /var/tmp/kv] [--json]

Two TieredCaches in one process open the same two tiers (a host-memory ``slab://`` in /dev/shm
and a disk ``slab://``), as the connector's halves do: the writer stores ``--fill`` chunks of
the embedded model's size (5.9 MB, 256 tokens), then, 40 times, stores one more and the reader
looks up that key and an absent one. Prints the reader's lookup latency (p50, p90, max).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from kvtier.cache import CacheConfig, TieredCache
from kvtier.cache.config import TierOptions
from kvtier.engines.vllm.open_tiers import tier_url
from kvtier.tiers.registry import open_tier

CHUNK = 5_898_240  # 256 tokens of SmolLM2-135M's bf16 KV, as vLLM's paged blocks hold it
ROUNDS = 40


def _cache(urls: list[str], writer: bool) -> TieredCache:
    tiers = [open_tier(tier_url(u), b"kvtier-slab-look") for u in urls]
    rest = "through" if writer else "none"
    opts = (TierOptions("through", promote=True), TierOptions(rest))
    config = CacheConfig(
        chunk_tokens=256, tiers=opts, queue_chunks=64, prefetch_pin_s=0.0, block_bytes=CHUNK
    )
    return TieredCache(tiers, config)


def measure(fill: int, disk_dir: Path) -> dict:
    """Lookup latencies (seconds) with ``fill`` chunks already written."""
    shm = Path(tempfile.mkdtemp(prefix="kvtier-look-", dir="/dev/shm"))
    disk = Path(tempfile.mkdtemp(prefix="kvtier-look-", dir=disk_dir))
    size = (fill + ROUNDS + 16) * CHUNK * 2
    urls = [f"slab://{shm}?size=512MiB&name=dram", f"slab://{disk}?size={size >> 20}MiB"]
    writer, reader = _cache(urls, True), _cache(urls, False)
    try:
        src = np.random.default_rng(0).integers(0, 255, CHUNK, dtype=np.uint8)

        def key(i: int) -> bytes:
            return i.to_bytes(16, "little")

        for i in range(0, fill, 16):
            writer.store([key(j) for j in range(i, i + 16)], [src] * 16, copy=False)
            writer.flush()
        lat, found = [], 0
        for i in range(fill, fill + ROUNDS):
            writer.store([key(i)], [src], copy=False)
            writer.flush()
            time.sleep(0.06)  # past the readers' rescan interval, as between vLLM's steps
            began = time.perf_counter()
            found += reader.lookup([key(i), key(1 << 60)]).hit_chunks
            lat.append(time.perf_counter() - began)
    finally:
        writer.close()
        reader.close()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    lat.sort()
    return {
        "fill_chunks": fill,
        "lookup_p50_s": statistics.median(lat),
        "lookup_p90_s": lat[int(0.9 * len(lat))],
        "lookup_max_s": lat[-1],
        "found": found,
        "lookups": ROUNDS,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fill", default="50,400", help="chunks written first, comma-separated")
    ap.add_argument("--dir", type=Path, default=Path(".kvtier"), help="where the disk tier goes")
    ap.add_argument("--json", action="store_true", help="JSON on stdout")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = [measure(int(f), args.dir) for f in args.fill.split(",")]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(
            f"{r['fill_chunks']:>5} chunks on disk: lookup p50 {1e3 * r['lookup_p50_s']:.1f} ms, "
            f"p90 {1e3 * r['lookup_p90_s']:.1f} ms, max {1e3 * r['lookup_max_s']:.1f} ms "
            f"(found {r['found']} of {r['lookups']})"
        )


if __name__ == "__main__":
    main()
