"""User hardware/model profiles from TOML and YAML, and the hardware presets they extend."""

import pytest

from kvtier.errors import SpecError
from kvtier.specs import GPUS, STORAGE, get_gpu, get_link, get_model, get_storage, load_profile

TOML = """
[gpus.mi300x]
hbm_bytes = 192e9
hbm_bandwidth = 5.3e12
bf16_flops = 1307e12
host_link = "pcie-gen5-x16"

[links.my-link]
nameplate_bandwidth = 63e9
achieved_bandwidth = 40e9

[storage.my-nvme]
kind = "nvme"
read_bandwidth = 12e9
write_bandwidth = 9e9
latency_s = 70e-6
capacity_bytes = 7.68e12
dwpd = 3.0

[models.tiny]
layers = 4
attention_heads = 8
kv_heads = 2
head_dim = 64
total_params = 50e6
"""

YAML = """
gpus:
  MI300X:
    hbm_bytes: 192.0e+9
    hbm_bandwidth: 5.3e+12
    bf16_flops: 1307.0e+12
storage:
  my-nvme:
    kind: nvme
    read_bandwidth: 12.0e+9
    write_bandwidth: 9.0e+9
    latency_s: 7.0e-5
    dwpd: 3.0
"""


def test_toml_profile(tmp_path):
    path = tmp_path / "hw.toml"
    path.write_text(TOML)
    p = load_profile(path)
    gpu = get_gpu("MI300X", extra=p.gpus)
    assert gpu.hbm_bytes == 192e9 and gpu.peak_flops("fp8") == 1307e12
    assert get_link("my-link", extra=p.links).achieved_bandwidth == 40e9
    nvme = get_storage("my-nvme", extra=p.storage)
    assert nvme.kind == "nvme" and nvme.dwpd == 3.0 and nvme.capacity_bytes == 7.68e12
    assert get_model("tiny", extra=p.models).kv_bytes_per_token() == 2 * 4 * 2 * 64 * 2
    assert get_gpu("h100", extra=p.gpus) is GPUS["h100"]


def test_yaml_profile_matches_toml(tmp_path):
    (tmp_path / "a.toml").write_text(TOML)
    (tmp_path / "b.yaml").write_text(YAML)
    a, b = load_profile(tmp_path / "a.toml"), load_profile(tmp_path / "b.yaml")
    assert a.gpus["mi300x"].hbm_bandwidth == b.gpus["mi300x"].hbm_bandwidth
    assert a.storage["my-nvme"].read_bandwidth == b.storage["my-nvme"].read_bandwidth


def test_empty_yaml_is_an_empty_profile(tmp_path):
    (tmp_path / "empty.yml").write_text("")
    assert load_profile(tmp_path / "empty.yml").gpus == {}


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("bad.toml", "[gpus.x\n", "not valid TOML"),
        ("bad.yaml", "gpus: [unclosed", "not valid YAML"),
        ("list.yaml", "- 1\n- 2\n", "must hold tables"),
        ("sect.toml", "[cpus.x]\na = 1\n", "unknown sections"),
        ("field.toml", "[gpus.x]\nhbm_bytes = 1e9\nwarp = 9\n", "unknown fields"),
        ("missing.toml", "[gpus.x]\nhbm_bytes = 1e9\n", "missing"),
        (
            "type.toml",
            '[gpus.x]\nhbm_bytes = "80GB"\nhbm_bandwidth = 1e12\nbf16_flops = 1e15\n',
            "'x'",
        ),
        (
            "neg.toml",
            "[gpus.x]\nhbm_bytes = -1\nhbm_bandwidth = 1e12\nbf16_flops = 1e15\n",
            "positive",
        ),
        ("entry.yaml", "storage:\n  fast: 7\n", "table of fields"),
    ],
)
def test_bad_profiles_raise_one_line_spec_errors(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_profile(path)
    assert needle in str(err.value)


def test_missing_profile_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read profile"):
        load_profile(tmp_path / "nope.toml")


def test_presets_are_sane_and_unknown_names_list_them():
    assert GPUS["h100"].hbm_bytes == 80e9 and GPUS["h200"].hbm_bytes == 141e9
    assert all(s.read_bandwidth > 0 for s in STORAGE.values())
    assert get_link(get_gpu("h100").host_link).achieved_bandwidth == 55e9
    with pytest.raises(SpecError, match="h100"):
        get_gpu("tpu-v9")
    with pytest.raises(SpecError, match="nvme-gen4"):
        get_storage("floppy")
