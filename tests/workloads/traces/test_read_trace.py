"""One entry point for every trace format: malformed lines are errors naming file and line, or
skipped and counted; a missing file or unknown format is a clear error."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.workloads.traces import read_trace

GOOD = '{"timestamp": 5, "input_length": 1030, "output_length": 2, "hash_ids": [1, 2, 3]}'
BAD = {
    "not JSON": ('{"timestamp": 5, "input_length"', "not JSON"),
    "not an object": ("[1, 2]", "must be a JSON object, got list"),
    "missing field": (
        '{"timestamp": 5, "output_length": 2, "hash_ids": []}',
        "field 'input_length' must be an integer, got nothing",
    ),
    "negative": (
        '{"timestamp": -1, "input_length": 9, "output_length": 2, "hash_ids": []}',
        "field 'timestamp' must be >= 0",
    ),
    "wrong type": (
        '{"timestamp": 5, "input_length": "9", "output_length": 2, "hash_ids": []}',
        "field 'input_length' must be an integer",
    ),
    "float length": (
        '{"timestamp": 5, "input_length": 9.5, "output_length": 2, "hash_ids": []}',
        "must be an integer",
    ),
    "id not int": (
        '{"timestamp": 5, "input_length": 9, "output_length": 2, "hash_ids": ["a"]}',
        "'hash_ids' must hold integers only",
    ),
    "too many ids": (
        '{"timestamp": 5, "input_length": 1024, "output_length": 2, "hash_ids": [1, 2, 3]}',
        "3 hash ids of 512-token blocks are more than input_length 1024 allows",
    ),
    "no prompt": (
        '{"timestamp": 5, "input_length": 0, "output_length": 2, "hash_ids": []}',
        "field 'input_length' must be >= 1",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_line_is_one_line_error_with_its_number_or_skipped(tmp_path, case):
    line, why = BAD[case]
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{GOOD}\n\n{GOOD}\n{line}\n{GOOD}\n")
    with pytest.raises(ConfigError) as err:
        read_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}:4: ") and why in message and "\n" not in message
    trace = read_trace(path, skip_bad=True)
    assert (len(trace.requests), trace.skipped) == (3, 1)


def test_skip_bad_counts_every_bad_line(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join([GOOD, *(line for line, _ in BAD.values()), GOOD]) + "\n")
    trace = read_trace(path, skip_bad=True)
    assert (len(trace.requests), trace.skipped) == (2, len(BAD))


def test_missing_file_unknown_format_and_bad_parameters(tmp_path):
    with pytest.raises(ConfigError, match=r"nope.jsonl does not exist"):
        read_trace(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="is not a file"):
        read_trace(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n")
    with pytest.raises(ConfigError, match="unknown trace format 'csv'; use one of mooncake"):
        read_trace(path, "csv")
    with pytest.raises(ConfigError, match="block_tokens must be at least 1"):
        read_trace(path, block_tokens=0)
    with pytest.raises(ConfigError, match="time_unit_s must be positive"):
        read_trace(path, time_unit_s=0)
    with pytest.raises(ConfigError, match="phase of a kvtier-run report"):
        read_trace(path, system="vllm")
    assert read_trace(path, time_unit_s=2.0).requests[0].arrival_s == 0.0
