"""The vLLM job's client: stream chunks into a completion, prompt hashes as the connector's
records write them, and what it says when a server (a real one on loopback) fails."""

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


class _Canned:
    """A real HTTP server on loopback answering every POST with one canned reply (status,
    body), or closing the connection unanswered (status 0): what the client reads off a vLLM
    server that streams, fails or breaks."""

    def __init__(self):
        import http.server
        import threading

        canned = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, body = canned.reply
                if status == 0:
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.reply = (200, "")
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def complete(self, status: int, body: str = "") -> object:
        import asyncio

        import httpx

        from kvtier.job.vllm_client import complete

        self.reply = (status, body)

        async def go():
            async with httpx.AsyncClient() as client:
                return await complete(client, self.url, "m", [1, 2, 3], 2)

        return asyncio.run(go())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_complete_streams_through_the_client_and_says_what_failed():
    from kvtier.specs.host import free_port

    server = _Canned()
    try:
        lines = 'data: {"choices": [{"token_ids": [4]}]}\n\ndata: [DONE]\n\n'
        c = server.complete(200, lines)
        assert c.output_ids == [4] and c.prompt_tokens == 3
        with pytest.raises(RequestError, match="HTTP 500: down"):
            server.complete(500, "down")
        with pytest.raises(RequestError, match=f"{server.url} sent a broken stream"):
            server.complete(200, "data: {not json\n\n")
    finally:
        server.close()
    import asyncio

    import httpx

    from kvtier.job.vllm_client import complete

    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: the connection is refused

    async def refused():
        async with httpx.AsyncClient() as client:
            return await complete(client, nobody, "m", [1, 2, 3], 2)

    with pytest.raises(RequestError, match=f"request to {nobody} failed") as caught:
        asyncio.run(refused())
    assert caught.value.__suppress_context__
