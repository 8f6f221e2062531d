"""The ``memory://`` tier's URL options, e.g. ``memory://?size=8GiB&eviction=lru&slot=1MiB``."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.tiers.url import CODEC_CHOICES, EVICTION_CHOICES, UrlOptions, opt, size_text

#: Blocks up to this many bytes are copied holding the GIL (``gil_copy_max=``'s default).
GIL_COPY_MAX = 256 * 1024


@dataclass(frozen=True, kw_only=True)
class MemoryOptions(UrlOptions):
    """What a ``memory://`` URL sets: capacity, eviction, slots, pinning, the copy path, name."""

    size: int = opt(
        "size", min=1, arg="capacity", example="8GiB", help="bytes held, headers included"
    )
    eviction: str = opt(
        "choice", "lru", choices=EVICTION_CHOICES, help="which block leaves first for room"
    )
    slot: int | None = opt(
        "size",
        None,
        min=1,
        arg="slot_size",
        example="1MiB",
        help="the arena's slot size (default: the first block's, rounded up to 4 KiB)",
    )
    pin: bool | None = opt(
        "tristate", None, help="page-locked arena for fast GPU copies (auto: with torch CUDA)"
    )
    gil_copy_max: int = opt(
        "size", GIL_COPY_MAX, help="blocks up to this size are copied holding the GIL"
    )
    native: bool | None = opt(
        "tristate", None, help="the one-block read in C (auto: where it is built)"
    )
    name: str | None = opt("str", None, help="the tier's name in stats (default: memory)")
    codec: str = opt(
        "choice", "raw", choices=CODEC_CHOICES, help="how blocks are stored (kv: compressed KV)"
    )

    def check(self) -> None:
        """A slot larger than the capacity could never be filled."""
        if self.slot is not None and self.slot > self.size:
            raise ConfigError(
                f"slot={size_text(self.slot)} larger than size={size_text(self.size)}: "
                "every put would fail"
            )


__all__ = ["GIL_COPY_MAX", "MemoryOptions"]
