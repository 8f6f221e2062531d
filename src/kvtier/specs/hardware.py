"""Hardware presets: GPUs, host links and storage/network tiers. Rates in bytes/s, decimal units."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvtier.errors import SpecError
from kvtier.specs.units import GB, TB

StorageKind = Literal["dram", "nvme", "network", "object", "kv-store"]


@dataclass(frozen=True)
class GPU:
    """One accelerator: HBM size and bandwidth, dense BF16 (and FP8) tensor throughput."""

    name: str
    hbm_bytes: float
    hbm_bandwidth: float
    bf16_flops: float
    fp8_flops: float | None = None
    host_link: str = "pcie-gen5-x16"

    def __post_init__(self) -> None:
        if min(self.hbm_bytes, self.hbm_bandwidth, self.bf16_flops) <= 0:
            raise SpecError(f"GPU {self.name!r}: memory, bandwidth and FLOP/s must be positive")

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense tensor FLOP/s for a compute dtype (fp8 falls back to bf16 where unsupported)."""
        if dtype == "fp8" and self.fp8_flops:
            return self.fp8_flops
        return self.bf16_flops


@dataclass(frozen=True)
class Link:
    """A host↔device path. ``achieved`` is what copies reach in practice, ``nameplate`` the spec."""

    name: str
    nameplate_bandwidth: float
    achieved_bandwidth: float
    latency_s: float = 10e-6

    def __post_init__(self) -> None:
        if not 0 < self.achieved_bandwidth <= self.nameplate_bandwidth:
            raise SpecError(f"link {self.name!r}: need 0 < achieved <= nameplate bandwidth")


@dataclass(frozen=True)
class Storage:
    """A KV tier medium: bandwidths, first-byte latency, capacity and (for flash) endurance."""

    name: str
    kind: StorageKind
    read_bandwidth: float
    write_bandwidth: float
    latency_s: float
    capacity_bytes: float = 0.0
    dwpd: float | None = None

    def __post_init__(self) -> None:
        if min(self.read_bandwidth, self.write_bandwidth) <= 0 or self.latency_s < 0:
            raise SpecError(f"storage {self.name!r}: bandwidths must be positive, latency >= 0")

    def with_capacity(self, capacity_bytes: float) -> Storage:
        """The same medium with another capacity."""
        from dataclasses import replace

        return replace(self, capacity_bytes=capacity_bytes)


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        # NVIDIA H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense BF16, 1979 FP8.
        GPU("h100", 80 * GB, 3.35 * TB, 989e12, 1979e12),
        # NVIDIA H200 datasheet: 141 GB HBM3e, 4.8 TB/s, same tensor cores as H100 SXM.
        GPU("h200", 141 * GB, 4.8 * TB, 989e12, 1979e12),
        # NVIDIA B200 (HGX): 180 GB HBM3e usable, 8 TB/s, 2.25 PFLOP/s dense BF16, 4.5 FP8.
        GPU("b200", 180 * GB, 8.0 * TB, 2250e12, 4500e12, host_link="pcie-gen6-x16"),
        # NVIDIA A100 80GB SXM datasheet: 2.039 TB/s, 312 TFLOP/s dense BF16, no FP8.
        GPU("a100-80gb", 80 * GB, 2.039 * TB, 312e12, host_link="pcie-gen4-x16"),
        # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, 362 TFLOP/s dense BF16, 733 FP8.
        GPU("l40s", 48 * GB, 864 * GB, 362e12, 733e12, host_link="pcie-gen4-x16"),
        # GeForce RTX 4090 (Ada whitepaper): 24 GB, 1008 GB/s, 165 TFLOP/s BF16 (FP32 accumulate).
        GPU("rtx-4090", 24 * GB, 1008 * GB, 165e12, 330e12, host_link="pcie-gen4-x16"),
    )
}

LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        # PCIe 4.0 x16: 16 GT/s × 16 lanes, 128b/130b → 31.5 GB/s; pinned H→D copies reach ~25 GB/s.
        Link("pcie-gen4-x16", 31.5 * GB, 25 * GB),
        # PCIe 5.0 x16: 63 GB/s nameplate; pinned H→D copies on H100 hosts reach ~55 GB/s.
        Link("pcie-gen5-x16", 63 * GB, 55 * GB),
        # PCIe 6.0 x16 (B200 hosts): 126 GB/s nameplate; ~100 GB/s assumed achievable.
        Link("pcie-gen6-x16", 126 * GB, 100 * GB),
        # NVLink-C2C (GH200): 450 GB/s per direction; ~400 GB/s measured for large copies.
        Link("nvlink-c2c", 450 * GB, 400 * GB, latency_s=2e-6),
    )
}

STORAGE: dict[str, Storage] = {
    s.name: s
    for s in (
        # Host DRAM as a KV tier: far faster than the PCIe link that returns it to the GPU.
        Storage("dram", "dram", 100 * GB, 50 * GB, 1e-6),
        # PCIe 4.0 NVMe (e.g. Samsung PM9A3 / 990 Pro class): ~7 GB/s read, ~5 GB/s write, ~80 µs.
        Storage("nvme-gen4", "nvme", 7 * GB, 5 * GB, 80e-6, dwpd=1.0),
        # PCIe 5.0 NVMe (e.g. Micron 9550 / Kioxia CM7 class): ~13-14 GB/s read, ~10 GB/s write.
        Storage("nvme-gen5", "nvme", 13 * GB, 10 * GB, 60e-6, dwpd=1.0),
        # Data-center mixed-use PCIe 4.0 NVMe rated 3 DWPD.
        Storage("nvme-gen4-3dwpd", "nvme", 7 * GB, 6 * GB, 80e-6, dwpd=3.0),
        # Shared KV stores over Ethernet/RDMA: ~90 % of line rate, tens of µs per request.
        Storage("net-100g", "network", 11.25 * GB, 11.25 * GB, 50e-6),
        Storage("net-200g", "network", 22.5 * GB, 22.5 * GB, 30e-6),
        Storage("net-400g", "network", 45 * GB, 45 * GB, 20e-6),
        # Redis/Valkey over 25 GbE: ~2.5 GB/s per node, ~200 µs per round trip.
        Storage("redis", "kv-store", 2.5 * GB, 2.5 * GB, 200e-6),
        # S3-compatible object storage: ~20 ms first byte; ~5 GB/s aggregate over many streams.
        Storage("object-store", "object", 5 * GB, 3 * GB, 20e-3),
    )
}


def _lookup(kind: str, name: str, pool: dict, extra: dict | None):
    merged = {**pool, **(extra or {})}
    key = name.strip().lower()
    for candidate in (key, key.replace("_", "-"), key.replace(" ", "-")):
        if candidate in merged:
            return merged[candidate]
    raise SpecError(f"unknown {kind} {name!r}; presets: {', '.join(sorted(merged))}")


def get_gpu(name: str, extra: dict[str, GPU] | None = None) -> GPU:
    """A GPU preset (or user profile entry) by name."""
    aliases = {"h100-sxm": "h100", "h100-80gb": "h100", "a100": "a100-80gb", "4090": "rtx-4090"}
    return _lookup("GPU", aliases.get(name.lower(), name), GPUS, extra)


def get_link(name: str, extra: dict[str, Link] | None = None) -> Link:
    """A host-link preset (or user profile entry) by name."""
    return _lookup("link", name, LINKS, extra)


def get_storage(name: str, extra: dict[str, Storage] | None = None) -> Storage:
    """A storage preset (or user profile entry) by name."""
    return _lookup("storage", name, STORAGE, extra)
