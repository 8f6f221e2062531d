"""Tier registry by URL scheme, imported lazily so a missing backend library costs nothing."""

from __future__ import annotations

import importlib

from kvtier.errors import ConfigError, MissingExtraError
from kvtier.tiers.base import Tier, TierURL

# scheme -> (module:class, extra to install, third-party module it needs)
REGISTRY: dict[str, tuple[str, str | None, str | None]] = {
    "memory": ("kvtier.tiers.memory.tier:MemoryTier", None, None),
    "file": ("kvtier.tiers.files.per_block:DiskTier", None, None),
    "slab": ("kvtier.tiers.files.slab:SlabTier", None, None),
    "redis": ("kvtier.tiers.redis:RedisTier", "redis", "redis"),
    "valkey": ("kvtier.tiers.redis:RedisTier", "redis", "redis"),
    "s3": ("kvtier.tiers.s3:S3Tier", "s3", "boto3"),
}


def tier_class(scheme: str) -> type[Tier]:
    """The Tier class registered for a URL scheme."""
    try:
        target, extra, needs = REGISTRY[scheme]
    except KeyError:
        raise ConfigError(
            f"no tier for scheme {scheme!r}; known: {', '.join(sorted(REGISTRY))}"
        ) from None
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError:
            raise MissingExtraError(f"the {scheme}:// tier", extra or scheme, needs) from None
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("kvtier"):
            raise ConfigError(f"the {scheme}:// tier is not available in this kvtier yet") from None
        raise


def open_tier(url: str, namespace: bytes) -> Tier:
    """Open a tier from its URL, e.g. ``memory://?size=8GiB`` or ``file:///nvme/kv?size=200GiB``."""
    parsed = TierURL.parse(url)
    return tier_class(parsed.scheme).from_url(parsed, namespace)


#: Schemes whose URL path is a local directory the tier keeps its files in.
DIRECTORY_SCHEMES = ("file", "slab")


def check_tier_url(url: str) -> None:
    """Refuse a tier URL that cannot work, without opening the tier (nothing is left behind).

    Unknown scheme or missing backend package (as :func:`tier_class`), an unreadable ``size``,
    and for ``file://``/``slab://`` a host name, no directory or size, or a directory that
    cannot hold files (:class:`~kvtier.errors.TierPathError` from ``usable_directory``).
    """
    from kvtier.specs.units import parse_size
    from kvtier.tiers.paths import usable_directory

    parsed = TierURL.parse(url)
    tier_class(parsed.scheme)
    if "size" in parsed.options:
        try:
            parse_size(parsed.options["size"])
        except ConfigError as exc:
            raise ConfigError(f"tier URL {url!r}: {exc}") from None
    if parsed.scheme not in DIRECTORY_SCHEMES:
        return
    scheme = parsed.scheme
    if parsed.netloc not in ("", "localhost"):
        raise ConfigError(
            f"{scheme}:// tier URL names host {parsed.netloc!r}; use {scheme}:///abs/path"
        )
    if not parsed.path or "size" not in parsed.options:
        raise ConfigError(
            f"{scheme}:// tier URL needs a directory and a size, e.g. {scheme}:///nvme/kv?size=200GiB"
        )
    usable_directory(parsed.path, f"{scheme}:// tier directory", keep=False)
