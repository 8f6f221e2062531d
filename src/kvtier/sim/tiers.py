"""kvtier's tiers below engine memory, on the real books: a :class:`SimTier` per tier.

Each tier keeps its books in the live cache's :class:`~kvtier.tiers.ledger.BlockLedger` with the
live eviction and admission policies, so what it holds, evicts and refuses is what the real
tier would. A block costs its stored size (raw / codec ratio) against the capacity. Reads and
writes are booked on the tier's links (:mod:`kvtier.sim.links`): the medium's queue (an NVMe
drive serves reads and writes in one queue; a shared store and the network are shared by every
replica), a decode stage when the tier compresses, and the host link when KV is consumed on a
device. A block is findable once its write has landed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvtier.cost.transfer import TransferPath
from kvtier.errors import ConfigError
from kvtier.sim.links import Leg, LinkQueue, book, unbooked_seconds
from kvtier.tiers.ledger import BlockLedger

#: The capacity of a tier given none: its server's, beyond any simulated workload.
UNLIMITED = 1 << 62


@dataclass(frozen=True)
class TierSpec:
    """One tier: medium speeds (stored bytes/s), first-byte latency, capacity (stored bytes;
    None: unlimited), codec ratio (raw/stored) and decode speed (raw bytes/s; None: no codec
    stage), books (eviction, admission after N offers), and whether every replica shares it.
    ``fixed_s`` is a load's fixed cost beyond the latency (lookups, submitting the reads);
    ``dwpd`` the drive's rated writes per day (flash tiers). ``path``: the cost model's load
    path for one of ``sharers`` tensor-parallel ranks (from specs, with the load path's fixed and
    per-copy costs); a read then takes what that path says on idle links, plus its waits on
    busy ones."""

    name: str
    read_bandwidth: float
    write_bandwidth: float
    latency_s: float
    capacity_bytes: float | None = None
    codec_ratio: float = 1.0
    decode_bandwidth: float | None = None
    shared: bool = False
    eviction: str = "lru"
    admit_after: int = 1
    fixed_s: float = 0.0
    dwpd: float | None = None
    path: TransferPath | None = None
    sharers: int = 1

    def to_dict(self) -> dict:
        """Plain JSON."""
        out = {k: v for k, v in self.__dict__.items() if k != "path"}
        out["path"] = asdict(self.path) if self.path is not None else None
        return out

    def __post_init__(self) -> None:
        if min(self.read_bandwidth, self.write_bandwidth) <= 0:
            raise ConfigError(f"tier {self.name!r}: bandwidths must be positive")
        if self.latency_s < 0 or self.fixed_s < 0:
            raise ConfigError(f"tier {self.name!r}: latency must not be negative")
        if self.capacity_bytes is not None and self.capacity_bytes <= 0:
            raise ConfigError(f"tier {self.name!r}: capacity must be positive (or unlimited)")
        if self.codec_ratio <= 0:
            raise ConfigError(f"tier {self.name!r}: codec ratio must be positive")


class SimTier:
    """A tier's books and links (see the module docs)."""

    def __init__(
        self,
        spec: TierSpec,
        medium: LinkQueue,
        *,
        network: LinkQueue | None = None,
        decoder: LinkQueue | None = None,
    ):
        self.spec = spec
        self.name = spec.name
        capacity = int(spec.capacity_bytes) if spec.capacity_bytes else UNLIMITED
        self.ledger: BlockLedger[float] = BlockLedger.admitting_after(
            max(capacity, 1), spec.eviction, spec.admit_after
        )
        self.medium = medium
        self.network = network
        self.decoder = decoder
        self.stored_blocks = 0
        self.refused = 0
        self.evicted = 0
        self.written_bytes = 0.0
        self.read_bytes = 0.0

    def stored_size(self, raw_bytes: float) -> int:
        """Bytes a block of ``raw_bytes`` takes in this tier."""
        return max(1, int(raw_bytes / self.spec.codec_ratio))

    def holds(self, key: bytes, now: float) -> bool:
        """Whether a read of ``key`` now finds it (its write has landed)."""
        ready = self.ledger.get(key)
        return ready is not None and ready <= now

    def read_legs(self, raw_bytes: float, host: LinkQueue | None) -> list[Leg]:
        """The stages a read of ``raw_bytes`` of KV passes, up to the model."""
        stored = raw_bytes / self.spec.codec_ratio
        legs = [Leg(self.medium, stored, self.spec.read_bandwidth)]
        if self.network is not None:
            legs.append(Leg(self.network, stored))
        if self.decoder is not None and self.spec.decode_bandwidth:
            legs.append(Leg(self.decoder, raw_bytes, self.spec.decode_bandwidth))
        if host is not None:
            legs.append(Leg(host, raw_bytes))
        return legs

    def read(self, keys: list[bytes], raw_bytes: float, now: float, host: LinkQueue | None):
        """Book a read of ``keys`` (``raw_bytes`` in all); the blocks count as used."""
        self.ledger.touch_many(keys)
        self.read_bytes += raw_bytes / self.spec.codec_ratio
        legs = self.read_legs(raw_bytes, host)
        transfer = book(now, legs)
        path = self.spec.path
        if path is not None:
            transfer.end += max(
                0.0, path.seconds(raw_bytes / self.spec.sharers) - unbooked_seconds(legs)
            )
        else:
            transfer.end += self.spec.fixed_s
        return transfer

    def offer(
        self, key: bytes, raw_bytes: float, now: float, host: LinkQueue | None, value: float = 0.0
    ) -> float | None:
        """Store a block (write-through): when it lands, or None when the tier holds it
        already, its admission refuses it or no room can be made."""
        ledger = self.ledger
        if key in ledger.index:
            ledger.touch(key)
            return None
        size = self.stored_size(raw_bytes)
        if not ledger.admit(key, size, value):
            self.refused += 1
            return None
        ok, _ = ledger.make_room(size, self._drop)
        if not ok:
            self.refused += 1
            return None
        legs = [Leg(self.medium, size, self.spec.write_bandwidth)]
        if self.network is not None:
            legs.insert(0, Leg(self.network, size))
        if host is not None:
            legs.insert(0, Leg(host, raw_bytes))
        landed = book(now, legs).end
        ledger.add(key, landed, size, value)
        self.stored_blocks += 1
        self.written_bytes += size
        return landed

    def hold(self, key: bytes, raw_bytes: float) -> bool:
        """Book a block as already held, with no I/O (a tier warm from earlier work)."""
        size = self.stored_size(raw_bytes)
        if key in self.ledger.index:
            return True
        ok, _ = self.ledger.make_room(size, self._drop)
        if ok:
            self.ledger.add(key, float("-inf"), size)
        return ok

    def _drop(self, key: bytes, entry: float, size: int) -> None:
        self.ledger.release(size)
        self.evicted += 1

    def path(self, host_bandwidth: float | None, host_latency: float = 0.0) -> TransferPath:
        """The tier's load path as the cost model sees it (idle links; bytes of one rank)."""
        spec = self.spec
        if spec.path is not None:
            return spec.path
        read = spec.read_bandwidth
        if self.network is not None:
            read = min(read, self.network.bandwidth)
        latency = spec.latency_s + spec.fixed_s + host_latency
        if self.network is not None:
            latency += self.network.latency_s
        return TransferPath(
            name=spec.name,
            latency_s=latency,
            read_bandwidth=read,
            device_bandwidth=host_bandwidth,
            codec_ratio=spec.codec_ratio,
            decode_bandwidth=spec.decode_bandwidth,
        )


__all__ = ["UNLIMITED", "SimTier", "TierSpec"]
