"""Real vLLM engines for the connector's tests: each runs in its own process (the probe).

Prompts are real text (Python's own source, tokenized by the embedded model's tokenizer) so
greedy decoding is not balanced on near-ties; lengths are chosen so that kvtier's chunks (256
tokens) and vLLM's blocks (128) put the cached/computed split at the same token, which makes
vLLM's arithmetic the same whether the prefix came from kvtier or from its own prefix cache.
"""

from __future__ import annotations

import os

import pytest

ALLOW_SKIP = "KVTIER_ALLOW_SKIP_VLLM"


def vllm_or_skip() -> None:
    """Fail (or, with KVTIER_ALLOW_SKIP_VLLM=1, skip) where vLLM is not installed."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        if os.environ.get(ALLOW_SKIP) == "1":
            pytest.skip(f"vLLM is not installed: {exc}")
        pytest.fail(f"vLLM is not installed here ({exc}); make test installs it")


@pytest.fixture(scope="session")
def text_tokens() -> list[int]:
    """A few thousand token ids of real text (Python's own source) from the model's tokenizer."""
    vllm_or_skip()
    import inspect
    import json as json_module
    import textwrap

    from transformers import AutoTokenizer

    from kvtier.engines.embedded import embedded_model_folder

    folder, _, _ = embedded_model_folder()
    tok = AutoTokenizer.from_pretrained(str(folder))
    text = "".join(
        inspect.getsource(m) for m in (textwrap, json_module.decoder, json_module.encoder)
    )
    ids = tok(text)["input_ids"]
    assert len(ids) > 6000
    return list(ids)


class EventListener:
    """A ZMQ subscriber to vLLM's KV events at ``endpoint`` (it connects: vLLM binds an ipc
    endpoint), collecting every event it hears on a thread until :meth:`stop`."""

    def __init__(self, endpoint: str, topic: bytes = b"kv"):
        import threading

        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self.events: list = []
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic)
        self._sub.setsockopt(zmq.RCVTIMEO, 200)
        self._sub.connect(endpoint)
        self._done = threading.Event()
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._again = zmq.Again
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._done.is_set():
            try:
                _topic, _seq, payload = self._sub.recv_multipart()
            except self._again:
                continue
            self.events.extend(self._decoder.decode(payload).events)

    def stop(self) -> list:
        """Stop listening (once; later calls only answer); every event heard."""
        if self._done.is_set():
            return self.events
        self._done.set()
        self._thread.join(5)
        self._sub.close(0)
        self._ctx.term()
        return self.events
