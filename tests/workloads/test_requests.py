"""Chained block keys: equal prefixes, equal keys; a chain extended later equals one made whole."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.requests import ROOT, TraceRequest, chain_keys, extend_keys


def test_extending_a_chain_gives_the_keys_of_the_whole_chain():
    whole = chain_keys([1, 2, 3, 4, 5], b"ns")
    assert extend_keys(whole[1], [3, 4, 5]) == whole[2:]
    assert extend_keys(ROOT, [1, 2]) == chain_keys([1, 2])
    assert chain_keys([1, 2, 9], b"ns")[:2] == whole[:2] != chain_keys([1, 2], b"other")
    assert chain_keys([2, 1], b"ns")[1] != whole[1]  # order matters


def test_a_request_cannot_have_more_blocks_than_its_prompt():
    with pytest.raises(ConfigError, match="more than a 8-token prompt has"):
        TraceRequest(0.0, 8, 1, chain_keys([1, 2, 3]), 4)
    assert len(TraceRequest(0.0, 9, 1, chain_keys([1, 2, 3]), 4).blocks) == 3
