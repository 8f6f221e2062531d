"""`kvtier bench serve --sessions`: multi-turn chats rendered with the embedded model's real
tokenizer and chat template, written as vLLM's `custom` dataset and read back by vLLM's own
dataset loader."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvtier.bench.serve_client import ClientRun, sessions_args
from kvtier.bench.serve_config import PrefixWorkload, ServeBenchConfig
from kvtier.bench.serve_sessions import TextDrawer, session_prompts, write_dataset
from kvtier.errors import ConfigError


@pytest.fixture(scope="module")
def tokenizer(embedded_fp32_tok):
    return embedded_fp32_tok.tokenizer


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_drawn_text_has_about_the_tokens_asked_and_follows_the_seed(tokenizer):
    draw = TextDrawer(tokenizer, 3, (1000, 40000)).draw
    texts = [draw(n) for n in (8, 300, 1000)]
    for n, text in zip((8, 300, 1000), texts, strict=True):
        assert abs(len(_ids(tokenizer, text)) - n) <= max(2, n // 50)
    again = TextDrawer(tokenizer, 3, (1000, 40000)).draw
    assert [again(n) for n in (8, 300, 1000)] == texts
    assert TextDrawer(tokenizer, 4, (1000, 40000)).draw(300) != texts[1]


def test_each_turn_extends_the_previous_prompt_and_sessions_take_turns(tokenizer):
    sessions, turns = 3, 4
    prompts = session_prompts(tokenizer, sessions, turns, 600, 40, 8, seed=1)
    assert len(prompts) == sessions * turns
    by_session = [prompts[s::sessions] for s in range(sessions)]
    for chat in by_session:
        ids = [_ids(tokenizer, p) for p in chat]
        for before, after in itertools.pairwise(ids):
            # the whole earlier prompt, token for token, then about an answer and a message
            assert after[: len(before)] == before
            assert 40 <= len(after) - len(before) <= 40 + 8 + 24
        assert 600 <= len(ids[0]) <= 600 + 64
        assert chat[0].rstrip().endswith("assistant")  # a generation prompt, ready to answer
    # different sessions share only the chat template's opening
    first = [_ids(tokenizer, chat[0]) for chat in by_session]
    shared = next(i for i, (a, b) in enumerate(zip(*first[:2], strict=False)) if a != b)
    assert shared < 64
    assert session_prompts(tokenizer, sessions, turns, 600, 40, 8, seed=1) == prompts
    assert session_prompts(tokenizer, sessions, turns, 600, 40, 8, seed=2)[0] != prompts[0]


def test_a_template_that_drops_the_history_is_refused(tokenizer):
    forgetful = copy.deepcopy(tokenizer)
    forgetful.chat_template = (
        "{{ '<|im_start|>user\\n' + messages[-1]['content'] + '<|im_end|>\\n' }}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(ValueError, match="extension of the previous one"):
        session_prompts(forgetful, 1, 2, 50, 10, 4)


def test_vllms_client_reads_the_dataset_in_order(tokenizer, tmp_path):
    pytest.importorskip("vllm")
    pytest.importorskip("pandas")
    from vllm.benchmarks.datasets import get_samples

    from kvtier.harness.bench_client import client_parser

    prompts = session_prompts(tokenizer, 2, 3, 200, 30, 4)
    path = write_dataset(tmp_path / "d" / "sessions.jsonl", prompts, 4)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [x["prompt"] for x in lines] == prompts and {x["output_tokens"] for x in lines} == {4}
    run = ClientRun("http://127.0.0.1:1", "m", sessions_args(path, 4), 6, 2, 0, tmp_path, "r", "x")
    args = client_parser().parse_args(run.argv())
    samples = get_samples(args, tokenizer)
    assert [s.prompt for s in samples] == prompts  # not shuffled, no template added again
    assert [s.expected_output_len for s in samples] == [4] * 6
    assert [s.prompt_len for s in samples] == [len(tokenizer(p).input_ids) for p in prompts]


def test_sessions_workload_shape_and_refusals(tmp_path):
    w = PrefixWorkload(4096, 128, 12, 48, 4, sessions=True)
    assert w.dataset == "sessions" and PrefixWorkload().dataset == "prefix_repetition"
    # the last turn: first message, three more answers and messages, its own answer, markers
    assert w.request_tokens >= 4096 + 128 + 3 * (128 + 4) + 4 + 64
    c = ServeBenchConfig(concurrency=(1, 4, 8), prefix=w, random=None)
    assert c.model_len() >= w.request_tokens and c.shape_gaps() == []
    short = ServeBenchConfig(concurrency=(1, 4, 8), prefix=replace(w, prompts=36), random=None)
    assert "3 turns per session < 4" in short.shape_gaps()
    assert w.client_args(Path("/x.jsonl"))[:4] == (
        "--dataset-name",
        "custom",
        "--dataset-path",
        "/x.jsonl",
    )
    with pytest.raises(ValueError, match="dataset file"):
        w.client_args()
    with pytest.raises(ConfigError, match="multiple of --num-prefixes"):
        ServeBenchConfig(prefix=PrefixWorkload(2048, 64, 4, 18, 4, sessions=True))
    with pytest.raises(ConfigError, match="at most --num-prefixes"):
        ServeBenchConfig(concurrency=(1, 8), prefix=PrefixWorkload(2048, 64, 4, 16, sessions=True))
