"""The shared Redis/Valkey tier (``redis://``, ``rediss://``, ``valkey://``), imported lazily so
its options can be read without the client library."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.tiers.redis.tier import RedisTier


def __getattr__(name: str) -> Any:
    if name == "RedisTier":
        from kvtier.tiers.redis.tier import RedisTier

        return RedisTier
    raise AttributeError(name)


__all__ = ["RedisTier"]
