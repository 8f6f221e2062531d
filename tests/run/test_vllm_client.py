"""The vLLM job's client without a server: stream chunks into a completion, metrics text into
series, prompt hashes as the connector's records write them."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from kvtier.run.vllm_client import (
    CompletionStream,
    RequestError,
    completion_body,
    metrics_delta,
    parse_metrics,
    prompt_hash,
    read_chunk,
)

METRICS = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="/m"} 3968.0
vllm:prefix_cache_hits_created{engine="0",model_name="/m"} 1.79e+09
# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="/m",source="local_compute"} 4224.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="/m",source="local_cache_hit"} 3968.0
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="1.0",model_name="/m"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="/m"} 2.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="/m"} 2.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="/m"} 4.25
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/m"} 0.0
# HELP kvtier_hit_tokens_total prompt tokens kvtier held
# TYPE kvtier_hit_tokens_total counter
kvtier_hit_tokens_total{engine="0",model_name="/m",tier="dram"} 512.0
"""


def test_metrics_keep_the_series_of_interest_without_engine_labels():
    m = parse_metrics(METRICS)
    assert m["vllm:prefix_cache_hits_total"] == 3968.0
    assert m["vllm:prompt_tokens_by_source_total{source=local_compute}"] == 4224.0
    assert m["vllm:request_prefill_time_seconds_sum"] == 4.25
    assert m["vllm:request_prefill_time_seconds_bucket{le=+Inf}"] == 2.0
    assert m["kvtier_hit_tokens_total{tier=dram}"] == 512.0
    assert not any(k.endswith("_created") for k in m)
    assert "vllm:num_requests_running" not in m  # a gauge of the moment, not of a phase


def test_metrics_delta_is_what_a_phase_added():
    before = {"a": 1.0, "b": 5.0}
    after = {"a": 4.0, "b": 5.0, "c": 2.0}
    assert metrics_delta(before, after) == {"a": 3.0, "c": 2.0}


def test_stream_chunks_make_a_completion():
    stream = CompletionStream(sent=10.0, prompt_tokens=3000)
    for i, line in enumerate(
        [
            'data: {"choices": [{"index": 0, "text": "a", "token_ids": [5]}]}',
            "",
            'data: {"choices": [{"index": 0, "text": "bc", "token_ids": [6, 7]}]}',
            'data: {"choices": [], "usage": {"prompt_tokens": 3000, "completion_tokens": 3, '
            '"prompt_tokens_details": {"cached_tokens": 2816}}, "metrics": '
            '{"time_to_first_token_ms": 480.5, "queue_time_ms": 0.1, "mean_itl_ms": null}}',
            "data: [DONE]",
        ]
    ):
        chunk = read_chunk(line)
        if chunk is not None:
            stream.feed(chunk, 10.5 + 0.1 * i)
    c = stream.done(11.0)
    assert c.output_ids == [5, 6, 7]
    assert c.ttft_s == pytest.approx(0.5) and c.e2e_s == pytest.approx(1.0)
    assert c.token_times_s == pytest.approx([0.5, 0.7, 0.7])
    assert c.cached_tokens == 2816 and c.prompt_tokens == 3000
    assert c.server == {"time_to_first_token_ms": 480.5, "queue_time_ms": 0.1}


def test_a_stream_without_tokens_or_with_an_error_fails():
    with pytest.raises(RequestError, match="without a token"):
        CompletionStream(0.0, 10).done(1.0)
    with pytest.raises(RequestError, match="error"):
        read_chunk('data: {"error": {"message": "too long"}}')


def test_the_body_asks_for_a_greedy_fixed_length_stream_over_token_ids():
    body = completion_body("m", [1, 2, 3], 16)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 16
    assert body["temperature"] == 0 and body["ignore_eos"] and body["stream"]
    assert body["return_token_ids"] and body["stream_options"] == {"include_usage": True}


def test_prompt_hash_is_xxh3_64_of_little_endian_uint32():
    ids = [1, 70000, 2**32 - 1]
    raw = b"".join(i.to_bytes(4, "little") for i in ids)
    assert prompt_hash(ids) == xxhash.xxh3_64_hexdigest(raw)
    assert prompt_hash(np.array(ids, dtype=np.int64)) == prompt_hash(ids)
    assert prompt_hash([1, 2]) != prompt_hash([2, 1])
