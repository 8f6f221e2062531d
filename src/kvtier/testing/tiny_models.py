"""Tiny random-weight models of other architectures, built from a transformers config.

Correctness tests of the connector need a model's KV layout and attention kinds, not trained
weights: a few-layer Llama with sliding-window layers (all, or alternating with full attention)
is built here in seconds, with another model's tokenizer (the embedded model's in the tests),
and saved as a safetensors folder vLLM serves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: The tokenizer files copied from the source model's folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def tiny_llama(
    folder: Path,
    source: Path,
    layer_types: list[str],
    sliding_window: int,
    seed: int = 0,
) -> Path:
    """A random-weight Llama in ``folder`` with one layer per entry of ``layer_types``
    (``full_attention`` or ``sliding_attention`` of ``sliding_window`` tokens), the vocabulary
    and tokenizer of the model in ``source`` (e.g. the embedded model's folder), in bfloat16.
    Returns ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    base = _base_config(source)
    config = LlamaConfig(
        vocab_size=base["vocab_size"],
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        initializer_range=0.2,  # logits far apart: greedy decoding does not sit on near-ties
        tie_word_embeddings=True,
        bos_token_id=base.get("bos_token_id"),
        eos_token_id=base.get("eos_token_id"),
        pad_token_id=base.get("pad_token_id"),
    )
    config.layer_types = list(layer_types)
    config.sliding_window = sliding_window
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    saved = json.loads((folder / "config.json").read_text())
    saved["layer_types"] = list(layer_types)
    saved["sliding_window"] = sliding_window
    (folder / "config.json").write_text(json.dumps(saved, indent=2))
    return _with_tokenizer(folder, source)


def tiny_mamba(folder: Path, source: Path, seed: int = 0) -> Path:
    """A random-weight two-layer Mamba in ``folder`` (its state is no per-token KV), with the
    tokenizer of the model in ``source``. Returns ``folder``."""
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    base = _base_config(source)
    config = MambaConfig(
        vocab_size=base["vocab_size"],
        hidden_size=128,
        state_size=16,
        num_hidden_layers=2,
        bos_token_id=base.get("bos_token_id"),
        eos_token_id=base.get("eos_token_id"),
        pad_token_id=base.get("pad_token_id"),
    )
    torch.manual_seed(seed)
    MambaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    return _with_tokenizer(folder, source)


def _base_config(source: Path) -> dict:
    """The config of the model in ``source`` (its vocabulary and special tokens are reused)."""
    return json.loads((source / "config.json").read_text())


def _with_tokenizer(folder: Path, source: Path) -> Path:
    """``folder`` with the tokenizer files of the model in ``source`` copied in."""
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


__all__ = ["tiny_llama", "tiny_mamba"]
