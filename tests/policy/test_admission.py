"""Admission policies decide which offered blocks enter a tier."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.policy.admission import (
    AdmitAll,
    FrequencyAdmission,
    MinValueAdmission,
    make_admission,
)


def k(i: int) -> bytes:
    return i.to_bytes(16, "little")


def test_admit_all():
    assert all(AdmitAll().admit(k(i), 10) for i in range(10))


def test_frequency_admission_turns_away_one_hit_wonders():
    policy = FrequencyAdmission(min_hits=2)
    assert not policy.admit(k(1), 10)
    assert not policy.admit(k(2), 10)
    assert policy.admit(k(1), 10)  # second offer
    assert not policy.admit(k(1), 10)  # counting starts over once admitted
    assert policy.admit(k(1), 10)


def test_frequency_admission_forgets_beyond_its_window():
    policy = FrequencyAdmission(min_hits=2, window=3)
    policy.admit(k(0), 1)
    for i in range(1, 5):  # four other keys push k(0) out of the table
        policy.admit(k(i), 1)
    assert not policy.admit(k(0), 1)
    assert policy.admit(k(4), 1)


def test_frequency_admission_of_one_admits_everything():
    policy = FrequencyAdmission(min_hits=1)
    assert policy.admit(k(1), 1) and policy.admit(k(2), 1)


def test_min_value_admission():
    policy = MinValueAdmission(min_seconds_per_byte=1e-6)
    assert policy.admit(k(1), size=1000, value=0.01)
    assert not policy.admit(k(1), size=1000, value=1e-4)
    assert policy.admit(k(1), size=1000)  # value unknown: admitted
    assert not MinValueAdmission(1e-6, require_value=True).admit(k(1), size=1000)


def test_make_admission():
    assert isinstance(make_admission("frequency", min_hits=3), FrequencyAdmission)
    assert isinstance(make_admission("ALL"), AdmitAll)
    with pytest.raises(ConfigError, match="frequency"):
        make_admission("lottery")
    with pytest.raises(ConfigError):
        FrequencyAdmission(min_hits=0)
