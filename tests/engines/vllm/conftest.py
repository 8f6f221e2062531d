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
