"""User hardware/model profiles from TOML or YAML files, extending the presets.

A profile file has optional tables ``models``, ``gpus``, ``links`` and ``storage``; each entry holds
the fields of the matching dataclass. Sizes and rates may be written as numbers (bytes, bytes/s).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from kvtier.errors import MissingExtraError, SpecError
from kvtier.specs.hardware import GPU, Link, Storage
from kvtier.specs.model import ModelSpec


@dataclass
class Profile:
    """Named models and hardware a user adds to (or overrides in) the presets."""

    models: dict[str, ModelSpec] = field(default_factory=dict)
    gpus: dict[str, GPU] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)
    storage: dict[str, Storage] = field(default_factory=dict)


def _build(cls, name: str, raw: object, where: Path):
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: entry {name!r} must be a table of fields")
    allowed = {f.name for f in fields(cls)}
    unknown = set(raw) - allowed
    if unknown:
        raise SpecError(
            f"{where}: entry {name!r} has unknown fields {sorted(unknown)}; "
            f"allowed: {sorted(allowed)}"
        )
    try:
        return cls(**{"name": name, **raw})
    except TypeError as exc:
        raise SpecError(f"{where}: entry {name!r}: {exc}") from None


def load_profile(path: str | Path) -> Profile:
    """Read a TOML (``.toml``) or YAML (``.yaml``/``.yml``) profile file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read profile {path}: {exc.strerror}") from None
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{path} is not valid TOML: {exc}") from None
    else:
        data = _yaml(path, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{path} must hold tables models/gpus/links/storage")
    return _tables(data, path)


def _yaml(path: Path, text: str) -> object:
    """A YAML profile's data (pyyaml comes with the ``tools`` extra)."""
    try:
        import yaml
    except ImportError:
        raise MissingExtraError(
            f"{path}: YAML profiles need pyyaml (pip install 'kvtier[tools]'), or give TOML"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid {path.suffix.lstrip('.').upper()}: {exc}") from None


def _tables(data: dict, path: Path) -> Profile:
    """The profile in a file's parsed tables."""
    kinds = {"models": ModelSpec, "gpus": GPU, "links": Link, "storage": Storage}
    unknown = set(data) - set(kinds)
    if unknown:
        raise SpecError(f"{path}: unknown sections {sorted(unknown)}; use {sorted(kinds)}")
    profile = Profile()
    for section, cls in kinds.items():
        entries = data.get(section) or {}
        getattr(profile, section).update(
            {name.lower(): _build(cls, name.lower(), raw, path) for name, raw in entries.items()}
        )
    return profile
