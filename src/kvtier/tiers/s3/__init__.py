"""The shared S3 tier (``s3://bucket/prefix?endpoint=...``), imported lazily so its options can
be read without the client library."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.tiers.s3.tier import S3Tier


def __getattr__(name: str) -> Any:
    if name == "S3Tier":
        from kvtier.tiers.s3.tier import S3Tier

        return S3Tier
    raise AttributeError(name)


__all__ = ["S3Tier"]
