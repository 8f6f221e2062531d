"""Real KV chunks of the embedded model, for measuring codecs: prompts of several kinds and
lengths, one forward each, the KV cut into chunks exactly as the HF engine stores them.

Prompt kinds: ``prose`` (seeded pseudo-English), ``code`` (kvtier's own Python sources), ``table``
(seeded CSV rows of numbers and names) and ``chat`` (a seeded multi-turn conversation in the
tokenizer's chat template). Each (kind, length) takes one forward of the model in fp32, whose KV
is stored in every dtype asked for (as an engine stores what it computes; fp16 and bf16 matmuls
run emulated, several times slower, on many CPUs). Each (model, dtype, kind, length) is kept
under the kvtier cache folder as ``.npy`` files of the sampled chunks (raw bit patterns, no
pickle), so later runs read it back in a moment.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.errors import ConfigError

KINDS: tuple[str, ...] = ("prose", "code", "table", "chat")
LENGTHS: tuple[int, ...] = (1024, 4096)
CHUNK_TOKENS = 256
_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an which have not "
    "we you they he she said would could about after before under over between through during "
    "model layer cache token memory request server storage latency bandwidth policy network "
    "river mountain city market history science music garden winter summer morning evening "
    "quickly slowly carefully because although however therefore meanwhile suddenly finally"
).split()
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CorpusItem:
    """Chunks of one prompt: (n, layers, 2, kv_heads, chunk_tokens, head_dim) 16-bit patterns."""

    dtype: str
    kind: str
    tokens: int
    chunks: np.ndarray  # uint16 or uint8 bit patterns of the model's KV dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one chunk."""
        return tuple(self.chunks.shape[1:])


def prompt_text(kind: str, seed: int, words: int) -> str | list[dict[str, str]]:
    """A prompt of ``kind`` with about ``words`` words (a message list for ``chat``)."""
    rng = random.Random(f"{kind}-{seed}")
    if kind == "prose":
        sentences = []
        while sum(len(s.split()) for s in sentences) < words:
            n = rng.randint(6, 20)
            s = " ".join(rng.choice(_WORDS) for _ in range(n))
            sentences.append(s[0].upper() + s[1:] + rng.choice(".!?."))
        return " ".join(sentences)
    if kind == "code":
        root = Path(__file__).resolve().parents[1]
        files = sorted(root.rglob("*.py"))
        rng.shuffle(files)
        out, count = [], 0
        for f in files:
            text = f.read_text(encoding="utf-8")
            out.append(f"# file: {f.relative_to(root)}\n{text}")
            count += len(text.split())
            if count >= words:
                break
        return "\n".join(out)
    if kind == "table":
        rows = ["id,name,region,price,quantity,ratio,updated"]
        while len(rows) * 9 < words:
            rows.append(
                f"{len(rows)},{rng.choice(_WORDS)}-{rng.randint(0, 999)},"
                f"{rng.choice(['north', 'south', 'east', 'west'])},{rng.uniform(0, 1e4):.2f},"
                f"{rng.randint(0, 5000)},{rng.random():.4f},2026-{rng.randint(1, 12):02d}-"
                f"{rng.randint(1, 28):02d}"
            )
        return "\n".join(rows)
    if kind == "chat":
        messages = [{"role": "system", "content": "You are a helpful assistant."}]
        total = 0
        while total < words:
            for role in ("user", "assistant"):
                n = rng.randint(10, 80)
                messages.append(
                    {"role": role, "content": " ".join(rng.choice(_WORDS) for _ in range(n))}
                )
                total += n
        return messages
    raise ConfigError(f"unknown prompt kind {kind!r}; use one of {', '.join(KINDS)}")


def prompt_ids(tokenizer, kind: str, seed: int, tokens: int) -> list[int]:
    """Exactly ``tokens`` token ids of a prompt of ``kind``."""
    words = tokens
    for _ in range(8):
        text = prompt_text(kind, seed, words)
        if isinstance(text, list):  # the template's text, tokenized like any other
            text = tokenizer.apply_chat_template(text, tokenize=False)
        ids = list(tokenizer(text)["input_ids"])
        if len(ids) >= tokens:
            return ids[:tokens]
        words = words * 2
    raise ConfigError(f"could not make a {tokens}-token {kind} prompt")


def sample_chunks(n: int, keep: int) -> list[int]:
    """``keep`` chunk indices spread evenly over ``n`` (first and last included)."""
    if keep >= n:
        return list(range(n))
    if keep == 1:
        return [n // 2]
    return sorted({round(i * (n - 1) / (keep - 1)) for i in range(keep)})


def _cache_file(folder: Path, model_id: str, fingerprint: str, dtype: str, kind: str, tokens: int):
    tag = f"{model_id}-{fingerprint[:16]}-{dtype}-{kind}-{tokens}-c{CHUNK_TOKENS}-fp32src"
    return folder / f"{tag}.npy", folder / f"{tag}.json"


def load_corpus(
    dtypes: Sequence[str] = ("bf16", "fp16"),
    kinds: Sequence[str] = KINDS,
    lengths: Sequence[int] = LENGTHS,
    per_prompt: int = 2,
    progress: Progress | None = None,
    folder: Path | None = None,
) -> list[CorpusItem]:
    """The corpus: for every dtype × kind × length, ``per_prompt`` chunks of the prompt's KV.

    Computed with the embedded model where ``folder`` (default: ``kv-corpus`` in the kvtier
    cache folder) lacks it.
    """
    for kind in kinds:
        if kind not in KINDS:
            raise ConfigError(f"unknown prompt kind {kind!r}; use one of {', '.join(KINDS)}")
    for n in lengths:
        if n < CHUNK_TOKENS:
            raise ConfigError(f"prompt length {n} is shorter than one {CHUNK_TOKENS}-token chunk")
    if per_prompt < 1:
        raise ConfigError(f"chunks per prompt must be at least 1, got {per_prompt}")
    from kvtier.engines.embedded import cache_dir

    folder = folder or cache_dir() / "kv-corpus"
    ident = _identity()
    prompts = [(kind, seed, tokens) for kind in kinds for seed, tokens in enumerate(lengths)]
    found: dict[tuple[str, str, int], np.ndarray] = {}
    missing = []
    for kind, seed, tokens in prompts:
        for dtype in dtypes:
            chunks = _cached(folder, ident, dtype, kind, tokens, per_prompt)
            if chunks is None:
                missing.append((kind, seed, tokens))
                break
            found[(dtype, kind, tokens)] = chunks
    loaded = None
    for i, (kind, seed, tokens) in enumerate(missing, 1):
        if loaded is None:
            if progress:
                progress("real KV: loading the model (fp32)")
            from kvtier.engines.embedded import load_model

            loaded = load_model(None, dtype="fp32")
        if progress:
            progress(f"real KV {i}/{len(missing)}: a {tokens}-token {kind} prompt")
        computed = _compute(loaded, kind, seed, tokens, per_prompt)
        folder.mkdir(parents=True, exist_ok=True)
        for dtype in dtypes:
            chunks = _in_dtype(computed, dtype)
            npy, meta = _cache_file(folder, *ident, dtype, kind, tokens)
            np.save(npy, chunks, allow_pickle=False)
            meta.write_text(json.dumps({"per_prompt": per_prompt, "shape": chunks.shape}))
            found[(dtype, kind, tokens)] = chunks
    return [
        CorpusItem(dtype, kind, tokens, found[(dtype, kind, tokens)])
        for dtype in dtypes
        for kind, _seed, tokens in prompts
    ]


def _cached(
    folder: Path, ident: tuple[str, str], dtype: str, kind: str, tokens: int, per_prompt: int
) -> np.ndarray | None:
    """The kept chunks of one prompt in one dtype (a sample of ``per_prompt``), or None."""
    npy, meta = _cache_file(folder, *ident, dtype, kind, tokens)
    if not (meta.is_file() and npy.is_file()):
        return None
    info = json.loads(meta.read_text())
    if info.get("per_prompt", 0) < per_prompt:
        return None
    chunks = np.load(npy, allow_pickle=False)
    return chunks[sample_chunks(len(chunks), per_prompt)]


def _identity() -> tuple[str, str]:
    """(model id, weights fingerprint) of the embedded model, without loading it."""
    from kvtier.engines.embedded import embedded_model_folder

    _, fingerprint, model_id = embedded_model_folder()
    return model_id, fingerprint


def _compute(loaded, kind: str, seed: int, tokens: int, per_prompt: int) -> np.ndarray:
    import torch
    from transformers import DynamicCache

    from kvtier.engines.hf import forward_keywords
    from kvtier.engines.kv_layout import KVLayout, cache_to_chunks

    ids = prompt_ids(loaded.tokenizer, kind, seed, tokens)
    layout = KVLayout.from_model(loaded.model)
    name, _ = forward_keywords(loaded.model)
    with torch.inference_mode():
        cache = DynamicCache(config=loaded.model.config)
        loaded.model(torch.tensor([ids]), **{name: cache, "use_cache": True})
    n = tokens // CHUNK_TOKENS
    chunks = cache_to_chunks(cache, layout, CHUNK_TOKENS, 0, n)
    keep = sample_chunks(n, per_prompt)
    return chunks[keep].float().numpy().copy()


def _in_dtype(chunks: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 chunks stored in ``dtype``: their bit patterns (uint16 for 16-bit dtypes)."""
    import torch

    from kvtier.engines.embedded import torch_dtype

    out = torch.from_numpy(chunks).to(torch_dtype(dtype)).contiguous()
    bits = torch.uint16 if out.element_size() == 2 else torch.uint8
    return out.view(bits).numpy().copy()


__all__ = [
    "CHUNK_TOKENS",
    "KINDS",
    "LENGTHS",
    "CorpusItem",
    "load_corpus",
    "prompt_ids",
    "prompt_text",
    "sample_chunks",
]
