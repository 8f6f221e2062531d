"""The test servers: started on 127.0.0.1 and free ports, stopped by PID, failures with logs."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import pytest

from kvtier.testing import services
from kvtier.testing.service_fixtures import start_or_fail
from kvtier.testing.services import ServiceError, redis_ping, start_redis

pytestmark = pytest.mark.services


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_redis_starts_on_loopback_and_stops_by_pid(tmp_path):
    server = start_redis(tmp_path / "r")
    try:
        assert redis_ping(server.port)
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        listen = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{server.port}" in listen and f"0.0.0.0:{server.port}" not in listen
    finally:
        server.stop()
    assert not server.alive() and not _listening(server.port)
    server.stop()  # twice is fine


def test_s3_server_listens_only_on_loopback(s3_server):
    listen = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    mine = [line for line in listen.splitlines() if f"pid={s3_server.pids[0]}," in line]
    assert mine and all(" 127.0.0.1:" in line for line in mine), mine


def test_a_server_that_cannot_start_fails_with_its_log(tmp_path, monkeypatch):
    def broken(root, **kwargs):
        return start_redis(root, maxmemory="not-a-size")

    with pytest.raises(ServiceError, match="exited with code 1 before answering") as info:
        broken(tmp_path / "a")
    assert "maxmemory" in str(info.value)  # the server's own complaint, from its log
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(services.ALLOW_SKIP_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)could not start.*maxmemory"):
        start_or_fail(broken, tmp_path / "b")


def test_missing_binary_skips_only_when_allowed_and_not_in_ci(tmp_path, monkeypatch):
    def missing(root, **kwargs):
        raise ServiceError("no redis-server or valkey-server: run scripts/system-deps.sh")

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv(services.ALLOW_SKIP_ENV, "1")
    with pytest.raises(pytest.skip.Exception):
        start_or_fail(missing, tmp_path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no redis-server"):
        start_or_fail(missing, tmp_path)


def test_services_script_starts_and_stops(tmp_path):
    root = tmp_path / "svc"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "services.sh")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    started = subprocess.run(
        ["bash", script, "start", str(root)], capture_output=True, text=True, env=env, timeout=90
    )
    pids = [int(p) for p in (root / "pids").read_text().split()]
    try:
        assert started.returncode == 0, started.stderr
        lines = dict(line.split("=", 1) for line in started.stdout.splitlines())
        assert lines["KVTIER_REDIS_URL"].startswith("redis://127.0.0.1:")
        assert lines["KVTIER_S3_ENDPOINT"].startswith("http://127.0.0.1:")
    finally:
        subprocess.run(["bash", script, "stop", str(root)], check=True, timeout=30)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
