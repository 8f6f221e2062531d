"""What besides its token ids changes a vLLM request's KV, read off the request as key inputs.

vLLM folds the same inputs into its own prefix-cache block hashes
(``generate_block_hash_extra_keys``): the LoRA adapter, multimodal items overlapping a block, the
cache salt in the first block, the prompt embeddings. Its hashes are seeded per process, and
kvtier's blocks outlive processes and cross machines, so kvtier keys them itself, the same on
every process: an adapter by its name and a fingerprint of its files, a multimodal item by the
hash vLLM's processor gave it and its place, the salt as given, prompt embeddings by the bytes
of each chunk's rows. An input that cannot be keyed safely raises :class:`UnkeyableRequest`:
the connector then neither loads nor stores that request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.engines.embedded import fingerprint_files
from kvtier.keys import PLAIN, KeyInputs, PromptEmbeds, Span


class UnkeyableRequest(Exception):
    """A request carries an input that changes its KV and that kvtier cannot key safely."""


@dataclass
class AdapterIdentities:
    """LoRA adapters' identities (name, path and a fingerprint of the adapter's files).

    An adapter's files are read once per (name, path, id) for the life of the connector, as
    vLLM loads an adapter once; an adapter whose files are not on this machine (a hub id, a
    missing folder) cannot be told apart from another under the same name, so it is unkeyable.
    """

    _known: dict[tuple[str, str, int], str] = field(default_factory=dict)

    def identity(self, lora: Any) -> str:
        """``name\\0path\\0fingerprint`` of vLLM's ``LoRARequest`` ``lora``."""
        name = str(getattr(lora, "lora_name", "") or "")
        path = str(getattr(lora, "lora_path", "") or "")
        ident = (name, path, int(getattr(lora, "lora_int_id", 0) or 0))
        known = self._known.get(ident)
        if known is None:
            known = self._known[ident] = f"{name}\x00{path}\x00{_adapter_fingerprint(name, path)}"
        return known


def _adapter_fingerprint(name: str, path: str) -> str:
    if not name or not path:
        raise UnkeyableRequest("a LoRA adapter without a name or path")
    folder = Path(path).expanduser()
    try:
        if folder.is_file():
            return fingerprint_files([folder])
        files = [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
        if not files:
            raise UnkeyableRequest(
                f"LoRA adapter {name!r}: its files are not on this machine ({path})"
            )
        return fingerprint_files(files)
    except OSError as exc:
        raise UnkeyableRequest(f"LoRA adapter {name!r}: cannot read {path} ({exc})") from None


def _spans(request: Any) -> tuple[Span, ...]:
    spans = []
    for feature in getattr(request, "mm_features", None) or ():
        identifier = getattr(feature, "identifier", None) or getattr(feature, "mm_hash", None)
        position = getattr(feature, "mm_position", None)
        if not identifier or position is None:
            raise UnkeyableRequest("a multimodal input without a hash or placeholder range")
        modality = str(getattr(feature, "modality", "") or "mm")
        try:
            spans.append(
                Span("mm", f"{modality}:{identifier}", int(position.offset), int(position.length))
            )
        except (TypeError, ValueError) as exc:
            raise UnkeyableRequest(f"a multimodal input with a bad placeholder ({exc})") from None
    return tuple(spans)


def _embeds(request: Any) -> PromptEmbeds | None:
    tensor = getattr(request, "prompt_embeds", None)
    if tensor is None:
        return None
    import torch

    prompt_tokens = int(getattr(request, "num_prompt_tokens", -1))
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != 2 or tensor.shape[0] != prompt_tokens:
        raise UnkeyableRequest("prompt embeddings that are not one row per prompt position")
    host = tensor.detach().to("cpu").contiguous()
    rows = host.view(torch.uint8).numpy().reshape(host.shape[0], -1)
    flags = getattr(request, "prompt_is_token_ids", None)
    mask = None
    if flags is not None:
        mask = np.asarray(list(flags), dtype=bool)
        if mask.shape != (prompt_tokens,):
            raise UnkeyableRequest("a mixed prompt whose token/embedding mask has another length")
    return PromptEmbeds(rows, str(host.dtype).removeprefix("torch."), mask)


def key_inputs(request: Any, adapters: AdapterIdentities) -> KeyInputs:
    """The key inputs of vLLM ``Request`` ``request`` (raises :class:`UnkeyableRequest`)."""
    lora = getattr(request, "lora_request", None)
    salt = getattr(request, "cache_salt", None) or ""
    spans = _spans(request)
    embeds = _embeds(request)
    if lora is None and not salt and not spans and embeds is None:
        return PLAIN
    adapter = adapters.identity(lora) if lora is not None else ""
    return KeyInputs(adapter=adapter, salt=str(salt), spans=spans, embeds=embeds)


__all__ = ["AdapterIdentities", "UnkeyableRequest", "key_inputs"]
