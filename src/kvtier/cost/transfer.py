"""Seconds to bring KV back from a tier: latency, storage read, codec decode, host→device copy."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.specs.hardware import Link, Storage


@dataclass(frozen=True)
class TransferPath:
    """One way KV returns to where the model consumes it.

    ``read_bandwidth`` is in stored bytes/s, ``decode_bandwidth`` in raw bytes/s (None: no codec
    stage), ``device_bandwidth`` the host→device copy in raw bytes/s (None when KV is consumed on
    the host). ``codec_ratio`` is raw/stored bytes. When ``overlapped`` the stages run as a
    pipeline over chunks, so a transfer costs the first-byte latency plus its slowest stage;
    otherwise the stages run one after another and their times add up.
    """

    name: str
    latency_s: float
    read_bandwidth: float
    device_bandwidth: float | None = None
    codec_ratio: float = 1.0
    decode_bandwidth: float | None = None
    overlapped: bool = True

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ConfigError(f"path {self.name!r}: latency must not be negative")
        if self.read_bandwidth <= 0:
            raise ConfigError(f"path {self.name!r}: read bandwidth must be positive")
        for field in ("device_bandwidth", "decode_bandwidth"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise ConfigError(f"path {self.name!r}: {field} must be positive or None")
        if self.codec_ratio <= 0:
            raise ConfigError(f"path {self.name!r}: codec ratio (raw/stored) must be positive")

    @classmethod
    def from_specs(
        cls,
        storage: Storage,
        link: Link | None,
        *,
        codec_ratio: float = 1.0,
        decode_bandwidth: float | None = None,
        overlapped: bool = True,
        sharers: int = 1,
        name: str | None = None,
    ) -> TransferPath:
        """The path from a storage medium over a host link (None: KV stays on the host).

        ``sharers`` ranks read the medium at once (tensor parallelism): each gets an equal share
        of its read bandwidth, while each has its own host link.
        """
        if sharers < 1:
            raise ConfigError(f"sharers must be at least 1, got {sharers}")
        return cls(
            name=name or storage.name,
            latency_s=storage.latency_s + (link.latency_s if link else 0.0),
            read_bandwidth=storage.read_bandwidth / sharers,
            device_bandwidth=link.achieved_bandwidth if link else None,
            codec_ratio=codec_ratio,
            decode_bandwidth=decode_bandwidth,
            overlapped=overlapped,
        )

    def stage_seconds(self, raw_bytes: float) -> dict[str, float]:
        """Seconds each stage needs for ``raw_bytes`` on its own (latency excluded)."""
        stages = {"read": raw_bytes / self.codec_ratio / self.read_bandwidth}
        if self.decode_bandwidth:
            stages["decode"] = raw_bytes / self.decode_bandwidth
        if self.device_bandwidth:
            stages["to_device"] = raw_bytes / self.device_bandwidth
        return stages

    def seconds(self, raw_bytes: float) -> float:
        """Seconds until ``raw_bytes`` of KV are usable by the model (0 for nothing to move)."""
        if raw_bytes < 0:
            raise ConfigError(f"cannot transfer a negative number of bytes ({raw_bytes})")
        if raw_bytes == 0:
            return 0.0
        stages = self.stage_seconds(raw_bytes).values()
        return self.latency_s + (max(stages) if self.overlapped else sum(stages))

    @property
    def bandwidth(self) -> float:
        """Raw bytes/s the path sustains for large transfers (latency amortised away)."""
        stages = self.stage_seconds(1.0).values()
        return 1.0 / (max(stages) if self.overlapped else sum(stages))
