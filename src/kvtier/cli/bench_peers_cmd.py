"""``kvtier bench peers``: kvtier's tiers side by side with LMCache's backends and Mooncake Store's
own client, on the same KV, in one run, with the raw floor of each medium.

The servers it needs (Redis, one each for kvtier, LMCache and redis-py; a Mooncake Store master
and its store process) are started on 127.0.0.1 by the command itself and stopped by PID.

Found and registered by :func:`kvtier.cli.bench_cmd.make_bench_app` (``register_bench``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from kvtier.cli.options import JsonOnStdout, Strict
from kvtier.specs import MiB

#: Sizes of ``--quick``: a run of seconds that still visits every system and phase.
QUICK = {
    "chunk_rounds": 2,
    "prefix_tokens": 1024,
    "prefix_rounds": 2,
    "requests": 4,
    "throughput_rounds": 1,
}
QUICK_DEPTHS = "1,4"
#: Mooncake Store's memory, in rooms of the largest phase, and how long a read leases an object.
MOONCAKE_ROOMS = 5
MOONCAKE_LEASE_MS = 2000
#: Set in the command's second run, whose Mooncake clients bind to loopback through the shim.
SHIM_ENV = "KVTIER_PEERS_LOOPBACK_SHIM"
#: The command as its user gave it, for the report of that second run.
COMMAND_ENV = "KVTIER_PEERS_COMMAND"


def peers(
    ctx: typer.Context,
    directory: Annotated[
        Path,
        typer.Option("--dir", help="Where the disk tiers, fio's files and the servers' data go."),
    ] = Path(".kvtier/bench-peers"),
    model: Annotated[
        str,
        typer.Option(help="Model whose KV geometry the chunks have (another one's is synthetic)."),
    ] = "smollm2-135m",
    payload: Annotated[
        str | None,
        typer.Option(
            help="real: the embedded model's KV for one-chunk requests (computed once, kept); "
            "synthetic: bf16 with per-channel scales (default: real; --quick: synthetic)."
        ),
    ] = None,
    chunk_rounds: Annotated[
        int | None,
        typer.Option(help="Rounds of one-chunk store/retrieve (default: 12; --quick: 2)."),
    ] = None,
    prefix_tokens: Annotated[
        int | None, typer.Option(help="Tokens of the long prefix (default: 32768; --quick: 1024).")
    ] = None,
    prefix_rounds: Annotated[
        int | None,
        typer.Option(help="Rounds of long-prefix store/retrieve (default: 4; --quick: 2)."),
    ] = None,
    requests: Annotated[
        int | None,
        typer.Option(help="One-chunk requests per throughput pass (default: 64; --quick: 4)."),
    ] = None,
    throughput_rounds: Annotated[
        int | None,
        typer.Option(
            help="Rounds of each throughput pass; the median counts (default: 3; --quick: 1)."
        ),
    ] = None,
    depth: Annotated[
        str | None,
        typer.Option(help="Requests in flight, comma-separated (default: 1,4,16; --quick: 1,4)."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            help="Small sizes, a run of seconds (options given still count): every "
            "system and phase once."
        ),
    ] = False,
    lmcache: Annotated[bool, typer.Option(help="Measure LMCache's backends.")] = True,
    mooncake: Annotated[bool, typer.Option(help="Measure Mooncake Store and mooncake://.")] = True,
    redis: Annotated[bool, typer.Option(help="Measure Redis (servers started here).")] = True,
    fio: Annotated[bool, typer.Option(help="Run fio as the disk's floor when installed.")] = True,
    raw_twins: Annotated[
        bool, typer.Option(help="Also time kvtier's coded tiers with codec=raw.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of token ids and synthetic KV.")] = 0,
    json_out: JsonOnStdout = False,
    plot: Annotated[Path | None, typer.Option(help="Save a PNG of the figures here.")] = None,
    strict: Strict = False,
) -> None:
    """Store, look up and retrieve the same KV through kvtier, LMCache and Mooncake Store."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from rich.console import Console

    from kvtier.bench.env import BenchEnvironment
    from kvtier.bench.fio import fio_version
    from kvtier.bench.peers import PeersBench, PeersConfig, free_disk_bytes
    from kvtier.bench.peers_report import SCHEMA, peers_dict, peers_json, peers_plot, render
    from kvtier.bench.stats import GB
    from kvtier.cli.bench_cmd import given_command, parse_depths
    from kvtier.cli.console import print_report, step_progress
    from kvtier.errors import ConfigError
    from kvtier.tiers.paths import usable_directory, writable_file

    given = {
        "chunk_rounds": chunk_rounds,
        "prefix_tokens": prefix_tokens,
        "prefix_rounds": prefix_rounds,
        "requests": requests,
        "throughput_rounds": throughput_rounds,
    }
    sizes = {k: v for k, v in given.items() if v is not None}
    if quick:
        sizes = QUICK | sizes
    depth = depth or (QUICK_DEPTHS if quick else "1,4,16")
    config = PeersConfig(
        directory=Path(directory).resolve(),
        model=model,
        payload=payload or ("synthetic" if quick else "real"),
        depths=parse_depths(depth),
        lmcache=lmcache,
        fio=fio,
        raw_twins=raw_twins,
        seed=seed,
        **sizes,
    )
    directory = usable_directory(directory, "--dir", keep=True)
    if plot is not None:
        writable_file(plot, "--plot")
    need = 4 * config.room_bytes
    if free_disk_bytes(directory) < need:
        raise ConfigError(
            f"--dir {directory} has less than {need / GB:.1f} GB free for the disk tiers; "
            "free some or lower --prefix-tokens"
        )
    err = Console(stderr=True)
    unavailable: dict[str, str] = {}
    if mooncake:
        from kvtier.bench.peers_lmcache import PeerUnavailable
        from kvtier.bench.peers_mooncake import mooncake_version

        try:
            mooncake_version()
        except PeerUnavailable as exc:
            unavailable["Mooncake Store"] = str(exc)
            mooncake = False
    if mooncake:
        why = _preload_loopback(directory, ctx)
        if why:
            unavailable["Mooncake Store"] = f"its client cannot be kept on loopback: {why}"
            mooncake = False
    # a SIGTERM ends the run through the servers' clean-up (they are stopped by PID)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with contextlib.ExitStack() as stack:
            servers, missing = _start_servers(directory, stack, redis, mooncake, config.room_bytes)
            config = replace(config, **servers)
            with step_progress(err) as progress:
                bench = PeersBench(config)
                task = progress.add_task("bench peers", total=bench.steps())
                bench.on_step = lambda label: progress.update(task, advance=1, description=label)
                report = bench.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    report.unavailable.update(missing | unavailable)
    data = {
        "schema": SCHEMA,
        "date": datetime.now(UTC).date().isoformat(),
        "command": os.environ.get(COMMAND_ENV) or given_command("peers"),
        **peers_dict(report),
        "environment": BenchEnvironment.probe(directory, fio_version()).as_dict(),
    }
    print_report(json_out, lambda: peers_json(data), lambda out: render(report, out), 200)
    if plot is not None:
        err.print(f"plot saved to {peers_plot(report, plot)}")
    if strict and data["passed"] is False:
        raise typer.Exit(1)


def _start_servers(
    directory: Path, stack: contextlib.ExitStack, redis: bool, mooncake: bool, room: int
) -> tuple[dict, dict[str, str]]:
    """Start the servers the run needs on loopback (stopped when ``stack`` closes); the config
    fields naming them, and a line for each that could not start."""
    from kvtier.testing import services

    fields: dict = {}
    missing: dict[str, str] = {}
    if redis:
        urls = {}
        try:
            for side in ("kvtier", "lmcache", "reference"):
                server = services.start_redis(directory / "servers" / f"redis-{side}")
                stack.callback(server.stop)
                urls[side] = server.url
        except services.ServiceError as exc:
            missing["Redis"] = f"no Redis server started ({str(exc).splitlines()[0]})"
            urls = {}
        fields["redis"] = urls
    if mooncake:
        fields["mooncake"], why = _start_mooncake(directory, stack, services, room)
        if why:
            missing["Mooncake Store"] = why
    return fields, missing


def _start_mooncake(directory: Path, stack: contextlib.ExitStack, services, room: int):
    """A Mooncake Store master and store process on loopback; the address the bench uses (None
    and why, where it cannot start). The store lends room for several systems' prefixes at
    once (objects a read leased stay until the lease ends; past 90 % full the master evicts),
    and leases last ``MOONCAKE_LEASE_MS``, so what one system removed is gone before long."""
    from kvtier.bench.peers import MooncakeAddress
    from kvtier.tiers import TierURL

    try:
        server = services.start_mooncake(
            directory / "servers" / "mooncake",
            segment=f"{-(-MOONCAKE_ROOMS * room // MiB)}MB",
            lease_ms=MOONCAKE_LEASE_MS,
        )
    except services.ServiceError as exc:
        return None, f"Mooncake Store did not start ({str(exc).splitlines()[0]})"
    stack.callback(server.stop)
    parsed = TierURL.parse(server.url)
    metadata = parsed.options.get("metadata_server", "")
    url = f"{server.url}&timeout=30"
    return MooncakeAddress(parsed.netloc, metadata, url), ""


def _preload_loopback(directory: Path, ctx: typer.Context) -> str:
    """Mooncake's client binds its transfer engine's ports to every interface whatever it is
    told, in whichever process opens it (this one); so that nothing listens beyond loopback,
    the command runs again in a child process with the bind shim of
    :mod:`kvtier.testing.loopback` preloaded (once: the environment marks the child), and ends
    with the child's exit status. Returns why it could not ("" when this process has the
    shim)."""
    if os.environ.get(SHIM_ENV):
        return ""
    import subprocess

    from kvtier.cli.bench_cmd import given_command
    from kvtier.testing.loopback import ShimError, loopback_shim

    try:
        shim = loopback_shim(directory / "servers")
    except ShimError as exc:
        return str(exc).splitlines()[0]
    preload = os.environ.get("LD_PRELOAD", "")
    env = os.environ | {
        "LD_PRELOAD": f"{shim}:{preload}" if preload else str(shim),
        SHIM_ENV: str(shim),
        COMMAND_ENV: given_command("peers"),
    }
    entry = "from kvtier.cli.entry import main; main()"
    argv = [
        sys.executable,
        "-c",
        entry,
        "bench",
        "peers",
        *command_line(ctx),
    ]
    sys.stdout.flush()
    sys.stderr.flush()
    child = subprocess.Popen(argv, env=env)
    # a SIGTERM to this process reaches the child, which stops its servers by PID
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    raise typer.Exit(code if code >= 0 else 128 - code)


def command_line(ctx) -> list[str]:
    """The options ``ctx``'s command was given, as arguments that give them again (flags by
    their on or off name, values as text, unset ones left out). Options are told by their
    ``param_type_name``: typer brings its own copy of click's classes."""
    out: list[str] = []
    for param in ctx.command.params:
        if getattr(param, "param_type_name", "") != "option" or param.name not in ctx.params:
            continue
        value = ctx.params[param.name]
        if param.is_flag:
            names = param.opts if value else param.secondary_opts
            out += names[:1]
        elif value is not None:
            out += [param.opts[0], str(value)]
    return out


def register_bench(bench: typer.Typer) -> None:
    """Add ``peers`` to the ``kvtier bench`` sub-app."""
    bench.command("peers")(peers)
