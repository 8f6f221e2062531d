"""The URL options of the Mooncake Store tier:
``mooncake://MASTER_HOST:RPC_PORT?metadata_server=http://HOST:PORT/metadata``.

Where an option means what a key of vLLM's ``MooncakeStoreConfig`` (its JSON file) means, it has
that key's name: ``metadata_server``, ``protocol``, ``device_name``, ``global_segment_size``,
``local_buffer_size``; the URL's host and port are its ``master_server_address``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.specs.units import MiB
from kvtier.tiers.shared import SharedOptions
from kvtier.tiers.url import opt

#: The master's default ``-rpc_port``.
DEFAULT_MASTER_PORT = 50051
#: The master's default ``-metrics_port`` (its HTTP admin server).
DEFAULT_ADMIN_PORT = 9003
#: ``metadata_server=`` for transfer engines that ask each other, with no metadata server.
P2P_HANDSHAKE = "P2PHANDSHAKE"


@dataclass(frozen=True, kw_only=True)
class MooncakeOptions(SharedOptions):
    """What a ``mooncake://`` URL sets besides the master's address."""

    metadata_server: str = opt(
        "str",
        P2P_HANDSHAKE,
        example="http://127.0.0.1:8080/metadata",
        help="where transfer engines find each other's memory: the master's HTTP metadata "
        "server (http://HOST:PORT/metadata), etcd://HOST:PORT, or P2PHANDSHAKE (none)",
    )
    protocol: str = opt(
        "choice", "tcp", choices=("tcp", "rdma"), help="the transfer engine's transport"
    )
    device_name: str | None = opt(
        "str", None, help="rdma: the NICs to use, comma-separated, e.g. mlx5_0 (default: all found)"
    )
    global_segment_size: int = opt(
        "size",
        0,
        help="memory this client lends the store (0: none; a store process holds the capacity)",
    )
    local_buffer_size: int = opt(
        "size",
        256 * MiB,
        min=MiB,
        help="the client's registered buffer that blocks pass through (a batch's bytes at most)",
    )
    local_hostname: str | None = opt(
        "str",
        None,
        help="the address other Mooncake processes reach this client at "
        "(default: the one this host reaches the master from)",
    )
    admin: str | None = opt(
        "str",
        None,
        example="http://127.0.0.1:9003",
        help="the master's HTTP admin server (its -metrics_port), which lists blocks for "
        "usage and iteration (default: port 9003 of the master's host)",
    )
    batch: int = opt("int", 64, min=1, help="blocks in one call to the store")
    rate: int = opt(
        "size",
        256 * MiB,
        min=MiB,
        help="bytes per second a batch may be slowed to beyond its timeout",
    )

    def check(self) -> None:
        if self.ttl:
            raise ConfigError(
                "mooncake:// objects have no TTL (the store evicts them itself when full); "
                "drop ttl="
            )


__all__ = ["DEFAULT_ADMIN_PORT", "DEFAULT_MASTER_PORT", "P2P_HANDSHAKE", "MooncakeOptions"]
