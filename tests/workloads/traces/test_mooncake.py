"""Mooncake traces: the shipped 200-line slice read with the format's units and block size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.workloads.requests import chain_keys
from kvtier.workloads.traces import read_trace
from kvtier.workloads.traces.lines import TraceUnits
from kvtier.workloads.traces.mooncake import read_mooncake

SLICE = Path(__file__).resolve().parents[1] / "data" / "mooncake_head200.jsonl"


def raw() -> list[dict]:
    return [json.loads(line) for line in SLICE.read_text().splitlines()]


def test_every_line_becomes_a_request_in_seconds_with_512_token_blocks():
    lines = raw()
    trace = read_trace(SLICE)
    assert len(trace.requests) == 200 and trace.skipped == 0 and trace.run is None
    first, last = trace.requests[0], trace.requests[-1]
    assert first.arrival_s == 0.0
    assert last.arrival_s == pytest.approx(lines[-1]["timestamp"] / 1000)  # ms -> s
    assert [r.arrival_s for r in trace.requests] == sorted(r.arrival_s for r in trace.requests)
    assert all(r.block_tokens == 512 and r.session is None for r in trace.requests)
    by_shape = sorted((d["timestamp"], d["input_length"], d["output_length"]) for d in lines)
    got = sorted(
        (round(r.arrival_s * 1000), r.input_tokens, r.output_tokens) for r in trace.requests
    )
    assert got == by_shape


def test_last_block_is_partial_and_every_block_has_a_key():
    for r in read_trace(SLICE).requests:
        assert len(r.blocks) == -(-r.input_tokens // 512)
        assert r.input_tokens % 512  # every prompt of the slice ends in a partial block


def test_requests_sharing_hash_ids_share_exactly_that_prefix_of_keys():
    lines = raw()
    a, b = lines[1]["hash_ids"], lines[121]["hash_ids"]
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common == 67  # the slice's two requests 1 and 121 share 67 blocks
    ka, kb = chain_keys(a, b"mooncake"), chain_keys(b, b"mooncake")
    requests = read_trace(SLICE).requests
    ra = next(r for r in requests if r.blocks == ka)
    rb = next(r for r in requests if r.blocks == kb)
    assert ra.blocks[:common] == rb.blocks[:common]
    assert ra.blocks[common] != rb.blocks[common]


def test_block_size_time_unit_and_namespace_are_parameters(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 7, "input_length": 20, "output_length": 1, "hash_ids": [4, 5]}\n'
    )
    (r,), skipped = read_mooncake(path, TraceUnits(16, 1.0, b"x"))
    assert (r.arrival_s, r.block_tokens, skipped) == (0.0, 16, 0)  # rebased to the first
    assert r.blocks == chain_keys([4, 5], b"x") != chain_keys([4, 5], b"mooncake")
    other = read_trace(path, block_tokens=16).requests[0]
    assert other.blocks == chain_keys([4, 5], b"mooncake")
