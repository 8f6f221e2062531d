"""Tier registry by URL scheme, imported lazily so a missing backend library costs nothing.

Built-in schemes are in :data:`REGISTRY` (read-only). Other packages add tiers through the
entry-point group ``kvtier.tiers`` (name: the scheme, value: ``module:Class``), read when a
scheme is not built in, e.g. in ``pyproject.toml``::

    [project.entry-points."kvtier.tiers"]
    mytier = "mypackage.tier:MyTier"
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib import metadata
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kvtier.errors import ConfigError, MissingExtraError
from kvtier.tiers.base import Tier, TierURL

if TYPE_CHECKING:
    from kvtier.tiers.url import UrlOptions

#: The entry-point group out-of-tree tiers register in (name = scheme, value = module:Class).
ENTRY_POINT_GROUP = "kvtier.tiers"

# scheme -> (module:class, extra to install, third-party module it needs)
REGISTRY: Mapping[str, tuple[str, str | None, str | None]] = MappingProxyType(
    {
        "memory": ("kvtier.tiers.memory.tier:MemoryTier", None, None),
        "file": ("kvtier.tiers.files.per_block:DiskTier", None, None),
        "slab": ("kvtier.tiers.files.slab:SlabTier", None, None),
        "redis": ("kvtier.tiers.redis.tier:RedisTier", "redis", "redis"),
        "rediss": ("kvtier.tiers.redis.tier:RedisTier", "redis", "redis"),
        "valkey": ("kvtier.tiers.redis.tier:RedisTier", "redis", "redis"),
        "s3": ("kvtier.tiers.s3.tier:S3Tier", "s3", "obstore"),
        "mooncake": ("kvtier.tiers.mooncake.tier:MooncakeTier", "mooncake", "mooncake.store"),
    }
)

# scheme -> module:class of its URL options (light modules: no tier code is imported)
OPTION_CLASSES: Mapping[str, str] = MappingProxyType(
    {
        "memory": "kvtier.tiers.memory.options:MemoryOptions",
        "file": "kvtier.tiers.files.options:PerBlockOptions",
        "slab": "kvtier.tiers.files.options:SlabOptions",
        "redis": "kvtier.tiers.redis.options:RedisOptions",
        "rediss": "kvtier.tiers.redis.options:RedisOptions",
        "valkey": "kvtier.tiers.redis.options:RedisOptions",
        "s3": "kvtier.tiers.s3.options:S3Options",
        "mooncake": "kvtier.tiers.mooncake.options:MooncakeOptions",
    }
)


def _entry_point(scheme: str) -> metadata.EntryPoint | None:
    """The installed ``kvtier.tiers`` entry point named ``scheme`` (the first one found)."""
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            return ep
    return None


def _known() -> str:
    names = set(REGISTRY) | {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return ", ".join(sorted(names))


def _load_entry_point(scheme: str, ep: metadata.EntryPoint) -> type[Tier]:
    try:
        cls = ep.load()
    except Exception as exc:
        raise ConfigError(
            f"the {scheme}:// tier ({ep.value}, entry point of "
            f"{ep.dist.name if ep.dist else 'an installed package'}) does not load: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Tier)):
        raise ConfigError(f"the {scheme}:// tier's entry point {ep.value} is not a Tier class")
    return cls


def tier_class(scheme: str) -> type[Tier]:
    """The Tier class registered for a URL scheme."""
    try:
        target, extra, needs = REGISTRY[scheme]
    except KeyError:
        ep = _entry_point(scheme)
        if ep is None:
            raise ConfigError(f"no tier for scheme {scheme!r}; known: {_known()}") from None
        return _load_entry_point(scheme, ep)
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


def options_class(scheme: str) -> type[UrlOptions] | None:
    """The options dataclass of a scheme's URLs (:mod:`kvtier.tiers.url`); None for a tier that
    declares none. Built-ins are looked up without importing their tier; an entry-point tier's
    is what its class's ``options_class()`` returns, or its ``Options`` attribute."""
    target = OPTION_CLASSES.get(scheme)
    if target is not None:
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)
    if scheme in REGISTRY:
        return None
    cls = tier_class(scheme)
    declared = getattr(cls, "options_class", None)
    if callable(declared):
        try:
            return declared()
        except NotImplementedError:
            return None
    return getattr(cls, "Options", None)


def open_tier(url: str, namespace: bytes) -> Tier:
    """Open a tier from its URL, e.g. ``memory://?size=8GiB`` or ``file:///nvme/kv?size=200GiB``."""
    parsed = TierURL.parse(url)
    return tier_class(parsed.scheme).from_url(parsed, namespace)


#: Schemes whose URL path is a local directory the tier keeps its files in.
DIRECTORY_SCHEMES = ("file", "slab")


def replace_options(url: str, **changes: Any) -> str:
    """``url`` with some options changed (e.g. ``size=16 << 30``), checked like a parsed URL;
    the options class comes from the URL's scheme (:func:`options_class`)."""
    from kvtier.tiers.url import with_options

    return with_options(url, options_class(TierURL.parse(url).scheme), **changes)


def check_tier_url(url: str) -> None:
    """Refuse a tier URL that cannot work, without opening the tier (nothing is left behind).

    Unknown scheme or missing backend package (as :func:`tier_class`), options its typed
    options refuse (unknown, malformed, out of range, missing), and for ``file://``/``slab://``
    a directory that cannot hold files (:class:`~kvtier.errors.TierPathError` from
    ``usable_directory``).
    """
    from kvtier.tiers.paths import usable_directory
    from kvtier.tiers.url import parse_options

    parsed = TierURL.parse(url)
    tier_class(parsed.scheme)
    options = options_class(parsed.scheme)
    if options is not None:
        parse_options(options, parsed)
    if parsed.scheme not in DIRECTORY_SCHEMES:
        return
    scheme = parsed.scheme
    usable_directory(parsed.path, f"{scheme}:// tier directory", keep=False)
