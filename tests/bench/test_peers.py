"""``kvtier bench peers`` end to end on tiny sizes: every system (kvtier's tiers, LMCache's
backends, Mooncake Store's client, the raw references) stores and retrieves the same chunks,
each retrieved chunk equal to what was stored; the servers it started are gone after; a peer
that is not installed is one line of the report, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

QUICK = ["bench", "peers", "--quick", "--prefix-tokens", "512", "--json"]
SYSTEMS = {
    "kvtier memory://",
    "kvtier slab://",
    "kvtier redis://",
    "kvtier mooncake://",
    "memcpy",
    "redis-py GET",
    "LMCache local_cpu",
    "LMCache local_disk",
    "LMCache redis",
    "Mooncake client",
    "Mooncake raw get",
    "fio",
}


def _processes_in(root: Path) -> list[int]:
    """PIDs of processes whose working directory lies under ``root`` (servers left running)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")).is_relative_to(root):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.services
def test_every_system_returns_every_chunk_it_stored_bit_exact(tmp_path):
    # a child process: the command runs itself again with Mooncake's clients kept on loopback
    cmd = [sys.executable, "-c", "from kvtier.cli.entry import main; main()", *QUICK]
    done = subprocess.run(
        [*cmd, "--dir", str(tmp_path)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["schema"] == "kvtier.bench.peers/1" and doc["date"] and doc["environment"]["cpu"]
    assert doc["command"].startswith("kvtier bench peers --quick")
    cfg = doc["config"]
    assert cfg["payload"] == "synthetic" and cfg["prefix_tokens"] == 512
    assert cfg["geometry"]["chunk_bytes"] == 256 * 23040 and cfg["geometry"]["dtype"] == "bf16"
    assert doc["unavailable"] == {}
    systems = {s["name"]: s for s in doc["systems"]}
    assert set(systems) == SYSTEMS
    # chunk rounds, prefix rounds and throughput passes: chunks read back and compared
    once = cfg["chunk_rounds"] + cfg["prefix_rounds"] * 2 + len(cfg["depths"]) * cfg["requests"]
    for name, s in systems.items():
        assert s["error"] is None, (name, s["error"])
        if name == "fio":
            assert s["exact"] is None and s["latency_s"]["chunk"]["retrieve"]["count"] > 0
            continue
        reads = 2 if name == "LMCache local_disk" else 1  # cold, then warm from the page cache
        assert s["exact"] is True and s["chunks_checked"] == once * reads, name
        assert {"store", "lookup", "retrieve"} <= s["latency_s"]["prefix"].keys()
        assert {(t["depth"], t["op"]) for t in s["throughput"]} >= {
            (d, op) for d in cfg["depths"] for op in ("store", "retrieve")
        }
        assert s["bytes_per_token"] > 0
        if name.startswith("kvtier"):
            assert set(s["codec_bytes_per_token"]) == {"raw", "kv"}
    # the coded tiers hold fewer bytes a token than the raw chunks take
    raw = cfg["geometry"]["bytes_per_token"]
    assert systems["kvtier slab://"]["bytes_per_token"] < raw
    whats = {(t["tier_class"], t["what"].split(" at ")[0]) for t in doc["targets"]}
    for tier in ("host memory", "local disk", "redis"):
        assert (tier, "store GB/s") in whats
    assert ("mooncake", "retrieve GB/s") in whats
    assert _processes_in(tmp_path) == []  # every server it started was stopped


def test_a_peer_that_is_not_installed_is_one_line_and_the_rest_runs(monkeypatch, capsys, tmp_path):
    from kvtier.cli.main import app
    from kvtier.testing.cli import run_cli

    for name in [n for n in sys.modules if n.split(".")[0] in ("lmcache", "mooncake")]:
        monkeypatch.delitem(sys.modules, name)  # imported by earlier tests: forgotten
    monkeypatch.setitem(sys.modules, "lmcache", None)  # an import of it fails, as uninstalled
    monkeypatch.setitem(sys.modules, "mooncake", None)
    args = ["bench", "peers", "--quick", "--no-redis", "--no-fio", "--dir", str(tmp_path)]
    code, out, err = run_cli(app, monkeypatch, capsys, *args)
    assert code == 0 and "Traceback" not in out + err
    lines = [line for line in out.splitlines() if line.startswith("not available:")]
    assert len(lines) == 2
    assert any("LMCache" in x and "requirements/peers.txt" in x for x in lines)
    assert any("Mooncake" in x and "mooncake-transfer-engine" in x for x in lines)
    assert "kvtier memory://" in out and "memcpy" in out and "kvtier slab://" in out


def test_the_loopback_rerun_gives_the_command_its_own_options_again():
    from typer.main import get_command

    from kvtier.cli.bench_peers_cmd import command_line
    from kvtier.cli.main import cli

    peers = get_command(cli).commands["bench"].commands["peers"]  # type: ignore[attr-defined]
    given = ["--quick", "--no-fio", "--depth", "1,4", "--seed", "3", "--dir", "/tmp/x", "--json"]
    ctx = peers.make_context("peers", list(given))
    again = command_line(ctx)
    assert "--no-fio" in again and "--quick" in again and "--json" in again
    assert again[again.index("--depth") + 1] == "1,4" and again[again.index("--seed") + 1] == "3"
    assert "--payload" not in again  # unset: the child takes the same default
    assert peers.make_context("peers", again).params == ctx.params
