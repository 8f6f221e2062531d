"""What kvtier's connector costs on a workload with no reuse: several vLLM servers held at once,
the ``random`` rounds of ``kvtier bench serve`` taking turns between them, with each round's CPU
seconds per server process.

    .venv/bin/python scripts/connector_overhead.py [--systems vllm,kvtier,kvtier-off,noop]
        [--rounds 12] [--json]

Systems: ``vllm`` (no connector), ``kvtier`` (host-memory and disk tiers, as the bench runs it),
``kvtier-off`` (the same connector with storing and preloading off), ``noop`` (a connector that
does nothing: vLLM's connector path alone). Round ``r`` runs the systems in an order rotated by
``r`` (reversed every other pass), each after the held servers have stopped spinning, so no
system always follows the same one. Prints each round and, per system, the median throughput,
the median of its rounds' ratios to vLLM alone's round of the same index, and the median CPU
seconds of vLLM's engine core (its busy wait for the worker); and how throughput follows that
CPU over all rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

SYSTEMS = ("vllm", "kvtier", "kvtier-off", "noop")
SCRIPTS = Path(__file__).resolve().parent


def transfer_config(system: str, work: Path, shm: Path) -> dict | None:
    """vLLM's ``kv_transfer_config`` of ``system``."""
    from kvtier.harness.vllm_server import connector_config

    def tiers(dram: str) -> list[str]:
        return [
            f"slab://{shm / system}?size={dram}&name=dram",
            f"slab://{work / system}?size=8GiB&name=disk",
        ]

    if system == "vllm":
        return None
    if system == "kvtier":
        return connector_config(tiers("1600MiB"), chunk_tokens=256)
    if system == "kvtier-off":
        return connector_config(tiers("1600MiB"), chunk_tokens=256, store=False, preload=False)
    if system == "noop":
        return {
            "kv_connector": "NoopConnector",
            "kv_connector_module_path": "noop_connector",
            "kv_role": "kv_both",
        }
    raise SystemExit(f"unknown system {system!r} (choose from {', '.join(SYSTEMS)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    names = [s for s in args.systems.split(",") if s]
    for name in names:
        if name not in SYSTEMS:
            print(
                f"error: unknown system {name!r} (choose from {', '.join(SYSTEMS)})",
                file=sys.stderr,
            )
            sys.exit(2)
    if "vllm" not in names or len(names) < 2 or args.rounds < 1:
        print("error: --systems needs vllm and at least one more; --rounds >= 1", file=sys.stderr)
        sys.exit(2)

    from kvtier.bench.serve import wait_idle
    from kvtier.bench.serve_client import ClientRun, ClientWorker, random_args
    from kvtier.bench.serve_results import engine_core_seconds
    from kvtier.bench.stats import pearson_r
    from kvtier.engines.embedded import embedded_model_folder
    from kvtier.harness.processes import cpu_used
    from kvtier.harness.vllm_server import ServerConfig, VllmServer

    folder, _, _ = embedded_model_folder()
    # absolute: the tier URLs are built from it (slab://relative would name a host)
    Path(".kvtier").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvtier-overhead-", dir=".kvtier")).resolve()
    shm = Path(tempfile.mkdtemp(prefix="kvtier-overhead-", dir="/dev/shm"))
    rounds: list[dict] = []
    try:
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(ClientWorker(work / "client.log"))
            servers: dict[str, VllmServer] = {}

            def run(name: str, prompts: int, seed: int, tag: str) -> dict:
                server = servers[name]
                spec = ClientRun(
                    server.base_url,
                    server.model_name,
                    random_args(args.input_len, 16),
                    prompts,
                    4,
                    seed,
                    work / "results",
                    f"{tag}.json",
                    tag,
                )
                before = server.cpu_by_process()
                result = client.run(spec, 3600)
                cpu = cpu_used(before, server.cpu_by_process())
                return {"tput": result.total_token_throughput, "cpu_s": cpu}

            for name in names:
                config = ServerConfig(
                    folder,
                    pool_blocks=192,
                    max_model_len=4608,
                    kv_transfer_config=transfer_config(name, work, shm),
                    env={"PYTHONPATH": str(SCRIPTS)},
                )
                servers[name] = stack.enter_context(VllmServer(config, work / f"{name}.log"))
                run(name, 8, 1, f"{name}-warm")
            for r in range(args.rounds):
                k = r % len(names)
                order = names[k:] + names[:k]
                if (r // len(names)) % 2:
                    order.reverse()
                for name in order:
                    waited = wait_idle(list(servers.values()))
                    got = run(name, args.prompts, 10 + r, f"{name}-r{r}")
                    engine = engine_core_seconds(got["cpu_s"]) or 0.0
                    rounds.append(
                        {
                            "system": name,
                            "round": r,
                            "idle_wait_s": waited,
                            "engine_core_cpu_s": engine,
                            **got,
                        }
                    )
                    if not args.json:
                        print(
                            f"{name:11s} round {r:2d}  {got['tput']:7.0f} tok/s"
                            f"  engine core {engine:5.1f} s",
                            flush=True,
                        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    ref = {x["round"]: x["tput"] for x in rounds if x["system"] == "vllm"}
    summary = {}
    for name in names:
        mine = [x for x in rounds if x["system"] == name]
        summary[name] = {
            "rounds": len(mine),
            "median_tok_s": statistics.median(x["tput"] for x in mine),
            "paired_ratio_median": statistics.median(x["tput"] / ref[x["round"]] for x in mine),
            "engine_core_cpu_s_median": statistics.median(x["engine_core_cpu_s"] for x in mine),
        }
    corr = pearson_r([x["tput"] for x in rounds], [x["engine_core_cpu_s"] for x in rounds])
    out = {
        "systems": summary,
        "throughput_vs_engine_cpu_r": corr,
        "rounds": rounds,
        "prompts": args.prompts,
        "input_tokens": args.input_len,
    }
    if args.json:
        print(json.dumps(out))
        return
    for name, s in summary.items():
        print(
            f"{name:11s} median {s['median_tok_s']:7.0f} tok/s  vs vLLM alone (paired) "
            f"{s['paired_ratio_median']:.3f}  engine core {s['engine_core_cpu_s_median']:.1f} s"
        )
    if corr is not None:
        print(f"throughput against engine-core CPU over all rounds: r = {corr:+.2f}")


if __name__ == "__main__":
    main()
