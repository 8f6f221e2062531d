"""The run's profile: a saved one is used only when it fits; missing tiers are measured."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.cost.calibration import CalibrationProfile, TierFit, TransferFit
from kvtier.engines.profile import QuickPlan, break_even, match_tiers, mismatch, obtain_profile


class _Named:
    def __init__(self, name: str):
        self.name = name


def _fit(name: str, url: str) -> TierFit:
    return TierFit(name, url, TransferFit(1e-4, 1e9))


def test_tiers_match_by_name_then_by_scheme(tiny_profile):
    profile = CalibrationProfile.load(tiny_profile)
    profile = replace(
        profile,
        tiers={
            "memory": _fit("memory", "memory://?size=1GiB"),
            "nvme": _fit("nvme", "file:///x?size=1GiB"),
        },
    )
    fits, missing = match_tiers(
        profile,
        [
            ("memory://?size=8MiB", _Named("dram")),
            ("file:///y?size=2GiB", _Named("disk")),
            ("redis://h/0?size=1GiB", _Named("shared")),
        ],
    )
    assert set(fits) == {"dram", "disk"} and fits["disk"].url == "file:///x?size=1GiB"
    assert fits["dram"].name == "dram"  # renamed to the run's tier
    assert [t.name for _, t in missing] == ["shared"]


def test_saved_profile_is_used_only_for_its_model_and_host(tiny_profile, embedded_fp32_tok):
    profile = CalibrationProfile.load(tiny_profile)
    device = str(embedded_fp32_tok.model.device)
    threads = int(profile.host["threads"])
    assert mismatch(profile, embedded_fp32_tok, device, threads) is None
    assert "torch threads" in mismatch(profile, embedded_fp32_tok, device, threads + 1)
    other = replace(profile, model=replace(profile.model, fingerprint="0" * 32))
    assert "measured with model" in mismatch(other, embedded_fp32_tok, device, threads)
    bf16 = replace(profile, model=replace(profile.model, kv_dtype="bf16"))
    assert "KV bf16" in mismatch(bf16, embedded_fp32_tok, device, threads)


@pytest.mark.slow
def test_loaded_profile_gets_missing_tiers_measured(tiny_profile, embedded_fp32_tok, tmp_path):
    urls = [
        ("memory://?size=64MiB&name=dram", "dram"),
        (f"file://{tmp_path / 'd'}?size=256MiB&sync=0&name=disk", "disk"),
        ("memory://?size=64MiB&name=extra", "extra"),
    ]
    saved = CalibrationProfile.load(tiny_profile)
    without_disk = replace(saved, tiers={"dram": saved.tiers["dram"]})
    path = without_disk.save(tmp_path / "p.json")
    plan = QuickPlan(load_chunks=(1, 2), load_repeats=1, context_tokens=())
    profile, info = obtain_profile(embedded_fp32_tok, urls, 32, path=path, plan=plan)
    assert info.source == "loaded+measured" and info.path == str(path)
    assert sorted(info.measured) == ["disk", "extra"]
    assert set(profile.tiers) == {"dram", "disk", "extra"}
    assert profile.prefill == saved.prefill  # compute came from the file
    evens = break_even(profile)
    assert set(evens) == {"dram", "disk", "extra"}
    assert all(v is None or v >= 1 for v in evens.values())


def test_context_samples_fill_only_what_the_profile_lacks(embedded_fp32_tok):
    from kvtier.engines.profile import context_samples

    have = [(16, 0, 0.01), (64, 0, 0.03), (16, 64, 0.01)]
    plan = QuickPlan(context_tokens=(256,), full_tokens=(128,), context_new=(8,), repeats=1)
    got = context_samples(embedded_fp32_tok, have, plan)
    assert [(n, p) for n, p, _ in got] == [(8, 256), (128, 0)]
    assert all(s > 0 for *_, s in got)
    covered = [*have, (8, 512, 0.01), (256, 0, 0.1)]
    assert context_samples(embedded_fp32_tok, covered, plan) == []


def test_calibration_copies_of_small_tiers_get_room():
    from kvtier.engines.profile import roomy
    from kvtier.tiers.base import TierURL

    url = roomy("memory://?size=8MiB&name=dram", 100 << 20)
    parsed = TierURL.parse(url)
    assert parsed.scheme == "memory" and parsed.options == {"size": "100MiB", "name": "dram"}
    assert roomy("file:///d?size=4GiB", 100 << 20) == "file:///d?size=4GiB"
    assert TierURL.parse(roomy("file:///d?size=1MiB", 1 << 30)).path == "/d"
