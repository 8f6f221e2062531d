"""Reload time per path: latency + stages, pipelined (max) or serial (sum)."""

import pytest

from kvtier.cost import LoadOverheads, TransferPath
from kvtier.errors import ConfigError
from kvtier.specs import get_link, get_model, get_storage

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


def test_spec_paths_carry_the_fixed_costs_of_a_load_and_measured_ones_do_not():
    over = LoadOverheads()
    dram, link = get_storage("dram"), get_link("pcie-gen5-x16")
    spec = TransferPath.from_specs(dram, link)
    bare = TransferPath.from_specs(dram, link, overheads=None)
    assert spec.request_s == pytest.approx(over.lookup_s + over.engine_steps * over.engine_step_s)
    assert bare.request_s == 0.0 and bare.copy_bytes is None
    assert spec.seconds(1.0) - bare.seconds(1.0) == pytest.approx(spec.request_s)
    measured = TransferPath("disk", 1e-4, 7 * GB, 55 * GB, overlapped=False)
    assert measured.seconds(GB) == pytest.approx(1e-4 + 1 / 7 + 1 / 55)


def test_device_copies_are_issued_per_block_per_layer_and_per_k_and_v():
    model = get_model("llama-3.2-3b")
    over = LoadOverheads(copy_launch_s=1e-5)
    dram, link = get_storage("dram"), get_link("pcie-gen5-x16")
    p = TransferPath.from_specs(dram, link, overheads=over, model=model)
    assert p.copy_bytes == pytest.approx(16 * model.kv_bytes_per_token() / (model.layers * 2))
    tokens = 4096
    copies = tokens // 16 * model.layers * 2
    raw = tokens * model.kv_bytes_per_token()
    # 10 µs per copy is slower than the DMA: the copy stage is issue-bound.
    assert p.stage_seconds(raw)["to_device"] == pytest.approx(copies * 1e-5)
    free = LoadOverheads(copy_launch_s=0.0)
    fast = TransferPath.from_specs(dram, link, overheads=free, model=model)
    assert fast.stage_seconds(raw)["to_device"] == pytest.approx(raw / link.achieved_bandwidth)


def test_storage_goes_through_a_host_bounce_unless_gpudirect():
    nvme, dram, link = get_storage("nvme-gen5"), get_storage("dram"), get_link("pcie-gen5-x16")
    model = get_model("llama-3.2-3b")
    bounce = TransferPath.from_specs(nvme, link, model=model)
    direct = TransferPath.from_specs(nvme, link, model=model, gpudirect=True)
    assert not bounce.overlapped and TransferPath.from_specs(dram, link).overlapped
    assert direct.overlapped and direct.copy_bytes is None
    raw = 10 * GB
    stages = bounce.stage_seconds(raw)
    serial = bounce.fixed_s + stages["read"] + stages["to_device"]
    assert bounce.seconds(raw) == pytest.approx(serial)
    assert direct.seconds(raw) == pytest.approx(direct.fixed_s + raw / nvme.read_bandwidth)
    assert direct.seconds(raw) < bounce.seconds(raw)
