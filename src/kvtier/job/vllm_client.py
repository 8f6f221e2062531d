"""The vLLM job's client: streamed completions over token ids, and ``/metrics`` scrapes.

Requests go to vLLM's OpenAI completions API with ``prompt`` as a list of token ids, greedy
(``temperature`` 0), a fixed answer length (``ignore_eos``) and ``stream`` on, so the time to
the first streamed chunk is the time to first token seen by a client. The final usage chunk
carries the tokens vLLM found cached and its own timings (the server runs with
``--enable-prompt-tokens-details --enable-per-request-metrics``). httpx is imported when used
(vLLM brings it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvtier.engines.vllm.records import prompt_hash
from kvtier.errors import KvtierError
from kvtier.harness.scrape import (
    METRIC_PREFIXES,
    metrics_delta,
    parse_metrics,
    scrape_metrics,
)


class RequestError(KvtierError):
    """A completion request failed (HTTP error, broken stream, or no token came back)."""


@dataclass
class Completion:
    """What one streamed completion returned, timed on the client.

    ``ttft_s``: send → first streamed token; ``e2e_s``: send → end of stream;
    ``cached_tokens``: prompt tokens vLLM did not compute (its own prefix cache plus what a
    KV connector loaded); ``server``: vLLM's per-request timings (milliseconds, its names).
    """

    output_ids: list[int]
    prompt_tokens: int
    ttft_s: float
    e2e_s: float
    cached_tokens: int | None = None
    token_times_s: list[float] = field(default_factory=list)
    server: dict[str, float] = field(default_factory=dict)


def completion_body(
    model: str, prompt: list[int], max_tokens: int, *, ignore_eos: bool = True
) -> dict[str, Any]:
    """The JSON body of a streamed, greedy completion over token ids."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }


def read_chunk(line: str) -> dict[str, Any] | None:
    """One server-sent-events line as its JSON chunk (None for blank lines and ``[DONE]``)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        raise RequestError(f"unexpected stream chunk {data[:80]!r}")
    if "error" in chunk:
        raise RequestError(f"vLLM answered an error: {chunk['error']}")
    return chunk


class CompletionStream:
    """Accumulates one stream's chunks into a :class:`Completion` (clock started by the caller)."""

    def __init__(self, sent: float, prompt_tokens: int):
        self.sent = sent
        self.prompt_tokens = prompt_tokens
        self.ttft_s: float | None = None
        self.output_ids: list[int] = []
        self.token_times_s: list[float] = []
        self.cached: int | None = None
        self.server: dict[str, float] = {}

    def feed(self, chunk: Mapping[str, Any], now: float) -> None:
        for choice in chunk.get("choices") or ():
            ids = choice.get("token_ids") or []
            if ids and self.ttft_s is None:
                self.ttft_s = now - self.sent
            self.output_ids += [int(t) for t in ids]
            self.token_times_s += [now - self.sent] * len(ids)
        usage = chunk.get("usage")
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                self.cached = int(details["cached_tokens"])
            self.prompt_tokens = int(usage.get("prompt_tokens", self.prompt_tokens))
        metrics = chunk.get("metrics")
        if isinstance(metrics, dict):
            self.server = {
                k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and v == v
            }

    def feed_line(self, line: str) -> None:
        """Feed one server-sent-events line (:func:`read_chunk`), timed now."""
        chunk = read_chunk(line)
        if chunk is not None:
            self.feed(chunk, time.perf_counter())

    def done(self, now: float) -> Completion:
        if self.ttft_s is None:
            raise RequestError("the stream ended without a token")
        return Completion(
            self.output_ids,
            self.prompt_tokens,
            self.ttft_s,
            now - self.sent,
            self.cached,
            self.token_times_s,
            self.server,
        )


def _start(
    model: str, prompt: list[int], max_tokens: int
) -> tuple[dict[str, Any], CompletionStream]:
    """A completion's body, and its stream with the clock started (just before sending)."""
    body = completion_body(model, prompt, max_tokens)
    return body, CompletionStream(time.perf_counter(), len(prompt))


@contextmanager
def _request_errors(base_url: str) -> Iterator[None]:
    """A failed request to ``base_url`` or a broken stream from it, as a RequestError."""
    import httpx

    try:
        yield
    except httpx.HTTPError as exc:
        raise RequestError(f"request to {base_url} failed: {exc!r}") from None
    except ValueError as exc:  # a chunk that is not JSON
        raise RequestError(f"{base_url} sent a broken stream: {exc}") from None


async def complete(
    client: Any, base_url: str, model: str, prompt: list[int], max_tokens: int
) -> Completion:
    """Stream one completion through an ``httpx.AsyncClient``; RequestError on failure."""
    body, stream = _start(model, prompt, max_tokens)
    with _request_errors(base_url):
        async with client.stream("POST", base_url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                raise RequestError(f"vLLM answered HTTP {r.status_code}: {text[:300]}")
            async for line in r.aiter_lines():
                stream.feed_line(line)
    return stream.done(time.perf_counter())


def complete_sync(
    base_url: str, model: str, prompt: list[int], max_tokens: int, timeout_s: float = 600
) -> Completion:
    """:func:`complete` without an event loop (warm-up and probes)."""
    import httpx

    body, stream = _start(model, prompt, max_tokens)
    with (
        _request_errors(base_url),
        httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=timeout_s) as r,
    ):
        if r.status_code != 200:
            raise RequestError(f"vLLM answered HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            stream.feed_line(line)
    return stream.done(time.perf_counter())


def metric_total(metrics: Mapping[str, float], name: str, **labels: str) -> float:
    """The sum of series ``name`` in :func:`parse_metrics`'s output over its label sets (those
    carrying every one of ``labels``); 0 when it is absent."""
    want = {f"{k}={v}" for k, v in labels.items()}
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base == name and want <= set(rest.rstrip("}").split(",") if rest else ()):
            total += value
    return total


def served_model(base_url: str, timeout_s: float = 10) -> str:
    """The name of the model a server serves (its first ``/v1/models`` entry)."""
    import httpx

    try:
        r = httpx.get(base_url + "/v1/models", timeout=timeout_s)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise RequestError(f"cannot list the models of {base_url}: {exc!r}") from None


__all__ = [
    "METRIC_PREFIXES",
    "Completion",
    "CompletionStream",
    "RequestError",
    "complete",
    "complete_sync",
    "completion_body",
    "metric_total",
    "metrics_delta",
    "parse_metrics",
    "prompt_hash",
    "read_chunk",
    "scrape_metrics",
    "served_model",
]
