"""Byte units and parsing of human sizes ("8GiB", "200G", "512k")."""

import re

from kvtier.errors import ConfigError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4
KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4

_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": KB,
    "kib": KiB,
    "m": MiB,
    "mb": MB,
    "mib": MiB,
    "g": GiB,
    "gb": GB,
    "gib": GiB,
    "t": TiB,
    "tb": TB,
    "tib": TiB,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float) -> int:
    """Bytes in a size such as ``8GiB``, ``200G`` (binary), ``1.5TB`` (decimal) or ``4096``."""
    if isinstance(text, int | float):
        if text < 0:
            raise ConfigError(f"size must not be negative, got {text}")
        return int(text)
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"cannot read size {text!r}; write a number with an optional unit "
            "such as 512MiB, 8GiB, 2TB"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    """Short human form of a byte count, binary units (``1.5 GiB``)."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
