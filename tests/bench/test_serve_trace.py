"""A slice of the shipped Mooncake trace, scaled for ``kvtier bench serve``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.bench.serve_config import PrefixWorkload, ServeBenchConfig
from kvtier.bench.serve_trace import SEED_ID_STRIDE, TraceSlice, timed_trace_args
from kvtier.errors import ConfigError
from kvtier.harness.vllm_server import BLOCK_TOKENS

TRACE = Path(__file__).parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"


def _rows(n: int) -> list[dict]:
    with TRACE.open() as f:
        return [json.loads(next(f)) for _ in range(n)]


@pytest.fixture
def trace_file(tmp_path) -> Path:
    """The shipped trace's first lines, or a trace of that shape where ../shared lacks it."""
    if TRACE.exists():
        return TRACE
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": list(range(79))},
        {"timestamp": 40, "input_length": 1000, "output_length": 300, "hash_ids": [0, 1, 79]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_slice_keeps_the_traces_prefixes_and_times_scaled_to_the_model(trace_file, tmp_path):
    s = TraceSlice.read(trace_file, requests=2, block_tokens=64, time_scale=2.0, max_input=3072)
    first, second = s.items
    raw = [json.loads(line) for line in trace_file.read_text().splitlines()[:2]]
    assert first.at_s == 0.0
    assert second.at_s == pytest.approx((raw[1]["timestamp"] - raw[0]["timestamp"]) / 1000 * 2)
    assert first.input_tokens == 3072 and len(first.hash_ids) == 3072 // 64  # cut to the context
    assert first.hash_ids == tuple(raw[0]["hash_ids"][:48])
    assert first.output_tokens == min(16, raw[0]["output_length"])
    assert s.longest <= 3072 + 16 and s.tokens >= s.longest
    path = s.write(tmp_path / "t.jsonl", seed=3)
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert written[0]["hash_ids"][0] == raw[0]["hash_ids"][0] + 3 * SEED_ID_STRIDE
    assert [w["input_length"] for w in written] == [r.input_tokens for r in s.items]
    assert "timed_trace" in timed_trace_args(path, 64)


def test_the_workload_sizes_pools_and_requests_from_the_slice(trace_file):
    s = TraceSlice.read(trace_file, requests=2, block_tokens=32)
    config = ServeBenchConfig(
        systems=("vllm", "ceiling", "kvtier"), prefix=PrefixWorkload(trace=s), random=None
    )
    p = config.prefix
    assert p.dataset == "trace" and p.requests == 2 and p.request_tokens == s.longest
    assert config.model_len() >= s.longest
    assert config.ceiling_pool() * BLOCK_TOKENS >= s.tokens * len(config.concurrency)
    assert config.shape_gaps() == ["a trace's slice, not the target run's prefix workload"]
    assert json.dumps(config.as_dict())  # the report's JSON takes it
    with pytest.raises(ConfigError, match="two workloads"):
        ServeBenchConfig(prefix=PrefixWorkload(sessions=True, trace=s))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests": 0}, "--trace-requests"),
        ({"requests": 1, "block_tokens": 20}, "multiple of 16"),
        ({"requests": 1, "time_scale": 0.0}, "--trace-time-scale"),
        ({"requests": 10**7}, "lines"),
    ],
)
def test_bad_slices_are_refused_in_one_line(trace_file, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TraceSlice.read(trace_file, **kwargs)


def test_a_file_that_is_not_a_trace_is_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hello"}\n')
    with pytest.raises(ConfigError, match="not a Mooncake trace"):
        TraceSlice.read(bad, requests=1)
    with pytest.raises(ConfigError, match="--trace"):
        TraceSlice.read(tmp_path / "missing.jsonl", requests=1)
