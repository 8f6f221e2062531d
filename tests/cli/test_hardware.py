"""The model and hardware flags of `kvtier plan` and `kvtier simulate`, read once."""

from __future__ import annotations

import pytest

from kvtier.cli.hardware import read_hardware, spill_tiers
from kvtier.cost.transfer import SpillTier
from kvtier.errors import ConfigError
from kvtier.specs import get_gpu, get_link, get_storage


def test_presets_and_the_gpus_own_host_link():
    hw = read_hardware(None, "llama-3.1-8b", None, None, "h100", None)
    assert hw.gpu == get_gpu("h100")
    assert hw.link == get_link(hw.gpu.host_link)
    assert hw.storage is None
    assert read_hardware(
        None, "llama-3.1-8b", None, None, "h100", "pcie-gen5-x16"
    ).link == get_link("pcie-gen5-x16")


def test_a_profile_adds_its_storage_presets(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text(
        '[storage.fast-nvme]\nkind = "nvme"\nread_bandwidth = 20e9\nwrite_bandwidth = 10e9\n'
        "latency_s = 0.0001\n"
    )
    hw = read_hardware(profile, "llama-3.1-8b", None, None, "h100", None)
    assert hw.storage is not None and "fast-nvme" in hw.storage
    tiers = spill_tiers(hw, "0", "1TB", "fast-nvme", "none", 2.0, None)
    assert [t.role for t in tiers] == ["nvme"]
    assert tiers[0].storage == hw.storage["fast-nvme"] and tiers[0].codec_ratio == 2.0


def test_spill_tiers_fast_to_slow_with_the_codec_below_dram():
    hw = read_hardware(None, "llama-3.1-8b", None, None, "h100", None)
    tiers = spill_tiers(hw, "256GB", "3.84TB", "nvme-gen4", "redis:1TB", 1.5, 8e9)
    assert [t.role for t in tiers] == ["dram", "nvme", "shared"]
    dram, nvme, shared = tiers
    assert dram == SpillTier("dram", get_storage("dram"), 256e9)
    assert nvme == SpillTier("nvme", get_storage("nvme-gen4"), 3.84e12, 1.5, 8e9)
    assert shared.storage == get_storage("redis") and shared.capacity_bytes == 1e12
    assert spill_tiers(hw, "0", "0", "nvme-gen4", "none", 1.0, None) == []


def test_an_unreadable_size_names_its_flag():
    hw = read_hardware(None, "llama-3.1-8b", None, None, "h100", None)
    with pytest.raises(ConfigError) as bad:
        spill_tiers(hw, "lots", "0", "nvme-gen4", "none", 1.0, None)
    assert str(bad.value).startswith("--dram: ")
