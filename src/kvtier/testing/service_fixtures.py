"""pytest fixtures handing tests real servers (:mod:`kvtier.testing.services`).

``redis_server``, ``redis_cluster``, ``s3_server`` and ``mooncake_server`` are started once per
test session and stopped by PID at its end, whatever the tests did; ``spawn_server`` starts
servers a test owns (to kill, pause or fill), stopped when the test ends. A server that cannot
start fails the test with its log in the message. Only where its binary is missing and
``KVTIER_ALLOW_SKIP_SERVICES=1`` is set (never with ``CI`` set) is that a skip. Import the
fixtures in a ``conftest.py``::

    from kvtier.testing.service_fixtures import redis_server, s3_server  # noqa: F401
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier.testing import services
from kvtier.testing.services import ALLOW_SKIP_ENV, Service, ServiceError


def _may_skip() -> bool:
    return os.environ.get(ALLOW_SKIP_ENV) == "1" and not os.environ.get("CI")


def start_or_fail(start: Callable[..., Service], root: Path, **kwargs) -> Service:
    """``start(root, **kwargs)``; a ServiceError fails the test (or skips it, see above)."""
    try:
        return start(root, **kwargs)
    except ServiceError as exc:
        missing = str(exc).startswith("no ")
        if missing and _may_skip():
            pytest.skip(f"{exc} ({ALLOW_SKIP_ENV}=1)")
        pytest.fail(f"a test server could not start: {exc}", pytrace=False)


def _session_service(tmp_path_factory, name: str, start, **kwargs) -> Iterator[Service]:
    service = start_or_fail(start, tmp_path_factory.mktemp(name), **kwargs)
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> Iterator[Service]:
    """A Redis/Valkey server on 127.0.0.1 for the whole session (``.url``: ``redis://…/0``)."""
    yield from _session_service(tmp_path_factory, "redis", services.start_redis)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory) -> Iterator[Service]:
    """A 3-node Redis Cluster on 127.0.0.1 for the session (``.url`` ends in ``?cluster=1``)."""
    yield from _session_service(tmp_path_factory, "redis-cluster", services.start_redis_cluster)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[Service]:
    """A SeaweedFS S3 server on 127.0.0.1 for the session; ``.env`` holds its credentials,
    ``.endpoint`` its address. Tests set the credentials with ``s3_env``."""
    yield from _session_service(tmp_path_factory, "s3", services.start_s3)


@pytest.fixture(scope="session")
def mooncake_server(tmp_path_factory) -> Iterator[Service]:
    """A Mooncake Store on 127.0.0.1 for the session: a master and a store process holding
    256 MB (``.url``: ``mooncake://…``); a reader's lease lasts 2 s (the default is 10 s)."""
    yield from _session_service(
        tmp_path_factory, "mooncake", services.start_mooncake, lease_ms=2000
    )


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> Service:
    """The session's S3 server with its credentials in this test's environment."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


class ServerPool:
    """Servers a test owns: ``pool("redis" | "s3" | "mooncake", **kwargs)`` starts one,
    ``pool.restart(s)`` starts it again on its ports; all are stopped by PID when the test ends."""

    def __init__(self, root: Path):
        self.root = root
        self.started: list[Service] = []

    def __call__(self, kind: str, **kwargs) -> Service:
        starters = {
            "redis": services.start_redis,
            "s3": services.start_s3,
            "mooncake": services.start_mooncake,
        }
        root = self.root / f"{kind}-{len(self.started)}"
        service = start_or_fail(starters[kind], root, **kwargs)
        self.started.append(service)
        return service

    def restart(self, service: Service) -> Service:
        """``service`` started again (see :func:`kvtier.testing.services.restart`)."""
        again = start_or_fail(lambda _root: services.restart(service), service.root)
        self.started.append(again)
        return again

    def stop_all(self) -> None:
        for service in self.started:
            service.stop()


@pytest.fixture
def spawn_server(tmp_path) -> Iterator[ServerPool]:
    """A :class:`ServerPool`: servers of the test's own (to kill, pause or fill)."""
    pool = ServerPool(tmp_path)
    try:
        yield pool
    finally:
        pool.stop_all()


__all__ = [
    "ServerPool",
    "mooncake_server",
    "redis_cluster",
    "redis_server",
    "s3_env",
    "s3_server",
    "spawn_server",
    "start_or_fail",
]
