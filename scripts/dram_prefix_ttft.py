"""TTFT of a request whose long prefix comes from kvtier's host-memory tier (or, with ``--from
disk``, its disk tier alone) vs from vLLM's own prefix cache, on one server in one run
(alternating), with vLLM's OpenAI server.

    .venv/bin/python scripts/dram_prefix_ttft.py --prefix 8000 --rounds 3 [--from disk] [--json]
        [--option sync_host=false]

Each round: the request runs once with the prefix in vLLM's prefix cache (just computed), then
vLLM's prefix cache is reset (``/reset_prefix_cache``) and the same request runs again, its prefix
now loaded from kvtier's ``slab:///dev/shm`` tier (or the O_DIRECT disk ``slab://``), each
after the same second of quiet. Prints both TTFTs and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np

#: Seconds of quiet before each measured request. vLLM's engine-core and worker processes keep
#: polling for about a second after their last work (a request, a cache reset), taking CPU from
#: a forward that starts then; both requests of a round start after the same quiet.
QUIET_S = 1.0


def _post(url: str, body: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as resp:
        return resp.read()


def _ttft(base: str, model: str, prompt: list[int]) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    req = urllib.request.Request(
        f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    began = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if line.startswith(b"data: ") and b'"text"' in line:
                return time.perf_counter() - began
    raise RuntimeError("no token came back")


def main() -> None:
    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.harness.vllm_server import ServerConfig, VllmServer, connector_config
    from kvtier.specs.host import cpu_description

    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--from", dest="source", choices=("dram", "disk"), default="dram")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a kvtier connector option, e.g. sync_host=false (repeatable)",
    )
    args = ap.parse_args()
    folder, _, _ = embedded_model_folder()
    shm = Path(f"/dev/shm/kvtier-ttft-{uuid.uuid4().hex[:8]}")
    disk = Path(f"/tmp/kvtier-ttft-{uuid.uuid4().hex[:8]}")
    tiers = [f"slab://{disk}?size=2GiB"]
    if args.source == "dram":
        tiers.insert(0, f"slab://{shm}?size=1GiB")
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--option {item!r}: write KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    connector = connector_config(tiers, **options)
    config = ServerConfig(
        folder,
        max_model_len=min(8192, args.prefix + 512),
        kv_transfer_config=connector,
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    rng = np.random.default_rng(7)
    own, kvtier = [], []
    try:
        with VllmServer(config, disk.with_suffix(".log")) as server:
            base, model = server.base_url, server.model_name
            for _ in range(args.rounds):
                prefix = rng.integers(1000, 40000, args.prefix).tolist()
                prompt = prefix + rng.integers(1000, 40000, 64).tolist()
                _ttft(base, model, prompt)  # computes it: vLLM caches it, kvtier stores it
                time.sleep(QUIET_S)  # the stores reach the tier; the server goes quiet
                own.append(_ttft(base, model, prompt))
                _post(f"{base}/reset_prefix_cache")
                time.sleep(QUIET_S)  # the same quiet before the second request
                kvtier.append(_ttft(base, model, prompt))
                _post(f"{base}/reset_prefix_cache")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    out = {
        "prefix_tokens": args.prefix,
        "ttft_vllm_prefix_cache_s": own,
        "kvtier_tier": args.source,
        "ttft_kvtier_tier_s": kvtier,
        "ratio_median": statistics.median(kvtier) / statistics.median(own),
        "connector_options": options,
        "cpu": cpu_description(),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for a, b in zip(own, kvtier, strict=True):
            line = f"vLLM prefix cache {a:.3f} s   kvtier {args.source} {b:.3f} s"
            print(f"{line}   ratio {b / a:.2f}")
        print(f"median ratio {out['ratio_median']:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
