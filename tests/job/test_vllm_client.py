"""The vLLM job's client without a server: stream chunks into a completion, prompt hashes as
the connector's records write them."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from kvtier.job.vllm_client import (
    CompletionStream,
    RequestError,
    completion_body,
    prompt_hash,
    read_chunk,
)


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


def test_a_line_fed_is_timed_when_it_arrives():
    stream = CompletionStream(sent=0.0, prompt_tokens=4)
    stream.feed_line("")
    stream.feed_line('data: {"choices": [{"token_ids": [9, 8]}]}')
    stream.feed_line("data: [DONE]")
    c = stream.done(1e12)
    assert c.output_ids == [9, 8] and 0 < c.ttft_s < 1e12


def _complete(handler) -> object:
    import asyncio

    import httpx

    from kvtier.job.vllm_client import complete

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await complete(client, "http://vllm", "m", [1, 2, 3], 2)

    return asyncio.run(go())


def test_complete_streams_through_the_client_and_says_what_failed():
    import httpx

    lines = 'data: {"choices": [{"token_ids": [4]}]}\n\ndata: [DONE]\n\n'
    c = _complete(lambda request: httpx.Response(200, text=lines))
    assert c.output_ids == [4] and c.prompt_tokens == 3
    with pytest.raises(RequestError, match="HTTP 500: down"):
        _complete(lambda request: httpx.Response(500, text="down"))
    with pytest.raises(RequestError, match="http://vllm sent a broken stream"):
        _complete(lambda request: httpx.Response(200, text="data: {not json\n\n"))

    def refuse(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(RequestError, match="request to http://vllm failed") as caught:
        _complete(refuse)
    assert caught.value.__suppress_context__
