"""Reload time per path: latency + stages, pipelined (max) or serial (sum)."""

import pytest

from kvtier.cost import TransferPath
from kvtier.errors import ConfigError
from kvtier.specs import get_link, get_storage

GB = 1e9


def test_overlapped_path_costs_latency_plus_slowest_stage():
    p = TransferPath("nvme", 1e-4, read_bandwidth=7 * GB, device_bandwidth=55 * GB)
    assert p.seconds(14 * GB) == pytest.approx(1e-4 + 2.0)
    serial = TransferPath("nvme", 1e-4, 7 * GB, 55 * GB, overlapped=False)
    assert serial.seconds(14 * GB) == pytest.approx(1e-4 + 2.0 + 14 / 55)
    assert p.seconds(0) == 0.0


def test_codec_shrinks_stored_bytes_and_adds_a_decode_stage():
    plain = TransferPath("net", 0.0, read_bandwidth=2 * GB, device_bandwidth=50 * GB)
    packed = TransferPath("net", 0.0, 2 * GB, 50 * GB, codec_ratio=2.0, decode_bandwidth=20 * GB)
    assert packed.seconds(4 * GB) == pytest.approx(plain.seconds(4 * GB) / 2)
    slow_codec = TransferPath("net", 0.0, 2 * GB, 50 * GB, codec_ratio=2.0, decode_bandwidth=GB)
    assert slow_codec.seconds(4 * GB) == pytest.approx(4.0)
    assert set(slow_codec.stage_seconds(GB)) == {"read", "decode", "to_device"}


def test_host_consumed_path_has_no_device_stage():
    p = TransferPath("dram", 0.0, read_bandwidth=100 * GB)
    assert p.seconds(100 * GB) == pytest.approx(1.0)
    assert p.bandwidth == pytest.approx(100 * GB)


def test_from_specs_adds_latencies_and_shares_the_medium():
    nvme, link = get_storage("nvme-gen4"), get_link("pcie-gen5-x16")
    p = TransferPath.from_specs(nvme, link, sharers=4)
    assert p.name == "nvme-gen4"
    assert p.latency_s == pytest.approx(nvme.latency_s + link.latency_s)
    assert p.read_bandwidth == pytest.approx(nvme.read_bandwidth / 4)
    assert p.device_bandwidth == link.achieved_bandwidth
    assert TransferPath.from_specs(nvme, None).device_bandwidth is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"latency_s": -1.0},
        {"read_bandwidth": 0.0},
        {"device_bandwidth": 0.0},
        {"codec_ratio": 0.0},
        {"decode_bandwidth": -5.0},
    ],
)
def test_bad_paths_are_refused(kwargs):
    base = {"name": "x", "latency_s": 0.0, "read_bandwidth": GB}
    with pytest.raises(ConfigError):
        TransferPath(**{**base, **kwargs})


def test_negative_bytes_are_refused():
    with pytest.raises(ConfigError):
        TransferPath("x", 0.0, GB).seconds(-1)
