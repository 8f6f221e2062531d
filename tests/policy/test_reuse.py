"""Per-workload admission: expected reuse × seconds saved vs the slow tier's store cost."""

from __future__ import annotations

import pytest

from kvtier.policy.reuse import REUSE_PRIORS, ChunkValue, HintedAdmission, chunk_values

CHUNK = 16


def prefill(new: int, cached: int) -> float:
    return 1e-3 * new + 1e-6 * new * cached


def test_chunk_regions_follow_the_shared_preamble():
    values = chunk_values("rag", 40, 4, CHUNK, prefill, reload_seconds=1e-4)
    assert [v.region for v in values] == ["shared", "shared", "rag", "rag"]
    assert [v.reuses for v in values] == [REUSE_PRIORS["shared"]] * 2 + [0.0, 0.0]
    assert values[0].saved_s == pytest.approx(prefill(CHUNK, 0) - 1e-4)
    assert values[1].saved_s > values[0].saved_s  # later chunks attend to more: worth more
    assert values[2].value_s == 0.0
    chat = chunk_values("chat", 16, 2, CHUNK, prefill, reload_seconds=1e-4)
    assert [v.region for v in chat] == ["shared", "chat"] and chat[1].value_s > 0


def test_hinted_admission_weighs_value_against_store_cost():
    hints: dict[bytes, ChunkValue] = {}  # any mapping with .get serves as the hint source
    adm = HintedAdmission(hints, store_s_per_byte=1e-9, store_latency_s=1e-4)
    size = 1_000_000  # 1 ms to store
    assert adm.admit(b"unknown", size)  # nothing known against it
    hints.update(
        {
            b"doc": ChunkValue("shared", 2.0, 0.02),
            b"tail": ChunkValue("rag", 0.0, 0.02),
            b"cheap": ChunkValue("chat", 1.0, 0.0005),  # saves less than its store costs
        }
    )
    assert adm.admit(b"doc", size)
    assert not adm.admit(b"tail", size)
    assert not adm.admit(b"cheap", size)
    assert adm.admitted == {"shared": 1} and adm.refused == {"rag": 1, "chat": 1}
