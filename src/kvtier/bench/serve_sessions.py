"""Multi-turn chat sessions for ``kvtier bench serve``, as a file vLLM's own client sends.

vLLM's client has no dataset that keeps a conversation's history, but its ``custom`` dataset
sends the prompts of a JSON-lines file in order (``--disable-shuffle``, ``--skip-chat-template``).
Each session here is a chat rendered with the model's chat template: the first user message is
long (a document and a question about it), every later turn adds an assistant answer and a new
user message, so each prompt is the previous prompt followed by one more exchange. Sessions take
turns (turn 1 of every session, then turn 2, …): a session comes back only after every other one
ran, and while the client's concurrency is at most the number of sessions, a session's next turn
goes out only once as many requests as stand before its previous one have finished (with vLLM
serving first come, first served: after that one). The answers are drawn text, not the model's
(the client does not feed answers back); what a cache sees is the same either way: a long prompt
that extends one it served before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class TextDrawer:
    """Seeded text of about ``n`` tokens of ``tokenizer``: drawn ids, decoded, cut to ``n``."""

    def __init__(self, tokenizer: Any, seed: int, vocab: tuple[int, int]):
        self._tok = tokenizer
        self._rng = np.random.default_rng([seed, 4099])
        self._low, self._high = vocab

    def draw(self, n: int) -> str:
        ids = [int(t) for t in self._rng.integers(self._low, self._high, n + n // 4 + 8)]
        text = self._tok.decode(ids, skip_special_tokens=True)
        again = self._tok(text, add_special_tokens=False)["input_ids"][:n]
        return str(self._tok.decode(again, skip_special_tokens=True)).strip()


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def session_prompts(
    tokenizer: Any,
    sessions: int,
    turns: int,
    first_tokens: int,
    user_tokens: int,
    answer_tokens: int,
    seed: int = 0,
    vocab: tuple[int, int] = (1000, 48000),
) -> list[str]:
    """The prompts of ``sessions`` chats of ``turns`` turns each, sessions taking turns.

    A session's first user message has about ``first_tokens`` tokens; each later turn adds an
    answer of about ``answer_tokens`` and a user message of about ``user_tokens``. Raises
    ``ValueError`` if the chat template does not render a turn as an extension of the previous
    one (the reuse this workload exists for would then not be there).
    """
    draw = TextDrawer(tokenizer, seed, vocab).draw
    by_session: list[list[str]] = []
    for _ in range(sessions):
        messages = [{"role": "user", "content": draw(first_tokens)}]
        prompts = [_render(tokenizer, messages)]
        for _ in range(turns - 1):
            messages += [
                {"role": "assistant", "content": draw(answer_tokens)},
                {"role": "user", "content": draw(user_tokens)},
            ]
            prompts.append(_render(tokenizer, messages))
            if not prompts[-1].startswith(prompts[-2]):
                raise ValueError(
                    "the model's chat template does not render a chat turn as an extension of "
                    "the previous one"
                )
        by_session.append(prompts)
    return [by_session[s][t] for t in range(turns) for s in range(sessions)]


def write_dataset(path: Path, prompts: Sequence[str], output_tokens: int) -> Path:
    """``prompts`` as the JSON-lines file of vLLM's ``custom`` dataset."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for prompt in prompts:
            f.write(json.dumps({"prompt": prompt, "output_tokens": output_tokens}) + "\n")
    return path


__all__ = ["TextDrawer", "session_prompts", "write_dataset"]
