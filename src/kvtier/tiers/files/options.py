"""The URL options of the local-disk tiers: ``file:///dir?size=200GiB&depth=8`` (one file per
block) and ``slab:///dir?size=1GiB&slot=260KiB`` (slots in slab files)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.specs.units import format_bytes
from kvtier.tiers.files.device_io import require_gds
from kvtier.tiers.io.buffers import host_memory
from kvtier.tiers.url import (
    CODEC_CHOICES,
    EVICTION_CHOICES,
    IO_CHOICES,
    UrlOptions,
    opt,
    size_text,
)


@dataclass(frozen=True, kw_only=True)
class FileTierOptions(UrlOptions):
    """What ``file://`` and ``slab://`` URLs share: the directory, capacity, admission, I/O."""

    directory: str = opt("directory", example="/nvme/kv", help="where the tier keeps its files")
    size: int = opt(
        "size", min=1, arg="capacity", example="200GiB", help="bytes of blocks held on disk"
    )
    eviction: str = opt(
        "choice", "lru", choices=EVICTION_CHOICES, help="which block leaves first for room"
    )
    admit_after: int = opt("int", 1, min=1, help="a key is admitted on its N-th put")
    io: str = opt(
        "choice", "auto", choices=IO_CHOICES, help="the I/O backend (auto: uring if usable)"
    )
    depth: int = opt("int", 8, min=1, help="operations in flight")
    staging: int | None = opt(
        "size",
        None,
        example="96MiB",
        help="huge-page staging per io_uring ring (default: 96 MiB within the size; 0: none)",
    )
    direct: bool | None = opt(
        "tristate", None, help="O_DIRECT (auto: where the filesystem takes it)"
    )
    sync: bool = opt("switch", True, help="writes with O_DSYNC")
    name: str | None = opt("str", None, help="the tier's name in stats")
    codec: str = opt(
        "choice", "kv", choices=CODEC_CHOICES, help="how blocks are stored (raw: as they are)"
    )

    def check(self) -> None:
        """Staging no host could give is refused when the URL is given (as memory's size=)."""
        ram = host_memory()
        if self.staging is not None and self.staging > ram:
            raise ConfigError(
                f"staging={size_text(self.staging)} is more than this host's RAM "
                f"({format_bytes(ram)}); give a smaller staging= or leave it out"
            )


@dataclass(frozen=True, kw_only=True)
class PerBlockOptions(FileTierOptions):
    """A ``file://`` URL: one file per block (name defaults to ``disk``)."""

    dirsync: bool = opt("switch", False, help="fsync the folders of renamed files per batch")
    recycle: bool = opt("switch", True, help="overwrite kept files of departed blocks")
    gds: bool = opt(
        "switch",
        False,
        help="device reads and writes straight between files and GPU memory (GPUDirect "
        "Storage, through kvikio)",
    )

    def check(self) -> None:
        """gds=1 is refused where it cannot work (no CUDA device, no kvikio)."""
        super().check()
        if self.gds:
            require_gds()


@dataclass(frozen=True, kw_only=True)
class SlabOptions(FileTierOptions):
    """A ``slab://`` URL: blocks in fixed-size slots of slab files (name defaults to ``slab``)."""

    slot: int = opt(
        "size", 0, example="260KiB", help="the least slot size (0: each block's own size)"
    )
    rescan: float = opt(
        "seconds", 0.05, help="at most one rescan of other writers' files per this many seconds"
    )

    def check(self) -> None:
        """A slot larger than the capacity could never be filled."""
        super().check()
        if self.slot > self.size:
            raise ConfigError(
                f"slot={size_text(self.slot)} larger than size={size_text(self.size)}: "
                "every put would fail"
            )


__all__ = ["FileTierOptions", "PerBlockOptions", "SlabOptions"]
