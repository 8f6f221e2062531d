"""The URL options of the Redis/Valkey tier: ``redis://[user:pass@]host:port/db?cluster=1&ttl=600``
(``rediss://`` for TLS, ``valkey://`` the same as ``redis://``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.tiers.shared import SharedOptions
from kvtier.tiers.url import opt

#: The largest value Redis takes by default (``proto-max-bulk-len``).
MAX_VALUE = 512 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class RedisOptions(SharedOptions):
    """What a ``redis://`` URL sets besides its host, port, database and credentials."""

    cluster: bool = opt("switch", False, help="a Redis Cluster, through the cluster client")
    max_value: int = opt(
        "size",
        MAX_VALUE,
        min=4096,
        help="the largest value one key holds; bigger blocks are split over several keys",
    )
    batch: int = opt("int", 64, min=1, help="commands sent in one pipeline")
    ca: str | None = opt("str", None, help="rediss://: the CA file that signed the server")
    verify: bool = opt("switch", True, help="rediss://: check the server's certificate")


__all__ = ["MAX_VALUE", "RedisOptions"]
