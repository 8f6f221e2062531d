"""Configuration of a TieredCache: per-tier write mode, promotion and admission; queue sizes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from kvtier.errors import ConfigError
from kvtier.policy.admission import AdmissionPolicy

WriteMode = Literal["through", "back", "none"]
WRITE_MODES = ("through", "back", "none")


@dataclass(frozen=True)
class TierOptions:
    """How the cache writes one tier.

    ``write``: ``through`` — every store is written here (in the background); ``back`` — written
    only when the next faster tier evicts the block (needs a faster tier that spills, i.e. calls
    :meth:`~kvtier.tiers.base.Tier.add_spill_listener` listeners); ``none`` — never written
    (read-only, e.g. a shared tier filled elsewhere). ``promote``: blocks read from a slower tier
    are copied here (write-through tiers only; write-back tiers get them when evicted).
    ``admission`` filters every store and promotion into this tier.
    """

    write: WriteMode = "through"
    promote: bool = True
    admission: AdmissionPolicy | None = None

    def __post_init__(self) -> None:
        if self.write not in WRITE_MODES:
            raise ConfigError(f"unknown write mode {self.write!r}; use one of {WRITE_MODES}")


@dataclass(frozen=True)
class CacheConfig:
    """Knobs of a TieredCache.

    ``tiers`` holds one TierOptions (or just a write-mode string) per tier, fast→slow; empty
    means write-through everywhere. ``queue_chunks`` bounds each tier's background write queue:
    a write that finds it full is dropped and counted, the engine never waits.
    ``block_bytes`` (raw bytes of one chunk) sizes prefetch buffers; when unset the cache learns
    it from the blocks it sees. A tier that raised is skipped for ``error_backoff_s``, doubled
    per failure in a row up to ``error_backoff_max_s`` (the cache's circuit breaker).
    """

    chunk_tokens: int = 256
    tiers: tuple[TierOptions | str, ...] = ()
    queue_chunks: int = 256
    write_batch: int = 16
    skip_existing: bool = True
    lease_ttl_s: float = 30.0
    max_lease_s: float = 600.0
    prefetch_pin_s: float = 5.0
    prefetch_workers: int = 1
    error_backoff_s: float = 1.0
    error_backoff_max_s: float = 4.0
    block_bytes: int | None = None
    latency_buckets: tuple[float, ...] = field(
        default=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)
    )

    def __post_init__(self) -> None:
        opts = tuple(TierOptions(write=t) if isinstance(t, str) else t for t in self.tiers)
        object.__setattr__(self, "tiers", opts)
        for name in ("chunk_tokens", "queue_chunks", "write_batch", "prefetch_workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"CacheConfig.{name} must be at least 1")
        if not 0 < self.lease_ttl_s <= self.max_lease_s:
            raise ConfigError("CacheConfig needs 0 < lease_ttl_s <= max_lease_s")
        if self.prefetch_pin_s < 0 or self.error_backoff_s < 0 or self.error_backoff_max_s < 0:
            raise ConfigError("CacheConfig times cannot be negative")
        if self.block_bytes is not None and self.block_bytes < 1:
            raise ConfigError("CacheConfig.block_bytes must be positive when given")
        if list(self.latency_buckets) != sorted(set(self.latency_buckets)):
            raise ConfigError("CacheConfig.latency_buckets must be increasing")

    def options_for(self, n_tiers: int) -> tuple[TierOptions, ...]:
        """One TierOptions per tier, checked against the tier count."""
        opts: tuple[TierOptions, ...] = self.tiers or (TierOptions(),) * n_tiers  # type: ignore[assignment]
        if len(opts) != n_tiers:
            raise ConfigError(
                f"CacheConfig.tiers has {len(opts)} entries for {n_tiers} tiers; give one per tier"
            )
        if n_tiers and opts[0].write == "back":
            raise ConfigError(
                "the fastest tier cannot be write-back: it has no faster tier to spill into it"
            )
        for i in range(1, n_tiers):
            if opts[i].write == "back" and opts[i - 1].write == "none":
                raise ConfigError(
                    f"tier {i} is write-back but tier {i - 1} above it is never written; "
                    f"make tier {i - 1} or tier {i} write-through"
                )
        return opts

    def with_tiers(self, *tiers: TierOptions | str) -> CacheConfig:
        """A copy with these per-tier options (``"through"``, ``"back"``, ``"none"`` or objects)."""
        return replace(self, tiers=tuple(tiers))
