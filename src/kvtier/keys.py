"""Token ids → chained, keyed, model-fingerprinted block keys.

A key is 16 bytes: xxh3-128 over (namespace id, the chunk's extra inputs, parent key, the
chunk's token ids as little-endian uint32). Extra inputs are what besides token ids changes the
KV (a LoRA adapter, a cache salt, multimodal items, prompt embeddings: :class:`KeyInputs`); a
chunk without any keys exactly as plain token ids always have. The namespace id itself hashes
the model fingerprint, KV dtype and layout, tensor-parallel placement and an optional tenant
salt, so two namespaces never share a key. Nothing here depends on PYTHONHASHSEED or on the
process: the same inputs give the same keys on every machine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import xxhash

from kvtier.errors import ConfigError
from kvtier.specs.model import KVIdentity, ModelSpec

KEY_BYTES = 16
ROOT = b"\x00" * KEY_BYTES


@dataclass(frozen=True)
class Namespace(KVIdentity):
    """Everything that makes one KV block incompatible with another of the same tokens: the
    model's KV (:class:`KVIdentity`), its stored layout and tensor-parallel place, a tenant.

    ``fingerprint`` is a hash of the weights or a user-given revision; ``layout`` names the
    page/tensor layout of the stored bytes (e.g. ``"layer-kv-head-token-dim"``).
    """

    layout: str = "layer-kv-head-token-dim"
    tp_rank: int = 0
    tp_size: int = 1
    tenant: str = ""

    def __post_init__(self) -> None:
        if not self.model_id or not self.fingerprint:
            raise ConfigError("a namespace needs a model id and a weights fingerprint or revision")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ConfigError(f"tp_rank {self.tp_rank} out of range for tp_size {self.tp_size}")

    @classmethod
    def for_model(cls, spec: ModelSpec, fingerprint: str, **kw) -> Namespace:
        """The namespace of a ModelSpec's KV, sharded ``tp_size`` ways."""
        tp = kw.get("tp_size", 1)
        return cls(
            spec.name,
            fingerprint,
            spec.kv_dtype,
            spec.layers,
            spec.kv_heads_per_rank(tp),
            spec.head_dim,
            **kw,
        )

    @property
    def id(self) -> bytes:
        """16-byte identifier of this namespace (stable across processes and machines)."""
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()
        return xxhash.xxh3_128_digest(b"kvtier-namespace-v1\x00" + canonical)

    def with_tenant(self, tenant: str) -> Namespace:
        """The same namespace salted for one tenant: its keys match no other tenant's."""
        from dataclasses import replace

        return replace(self, tenant=tenant)


@dataclass(frozen=True)
class Span:
    """An input that replaces or conditions the KV of tokens ``[start, start + length)``.

    A multimodal item is one: its placeholder tokens are the same for every image, so the item's
    own hash (``identity``) keys every chunk the span overlaps, with its offset in that chunk.
    """

    kind: str
    identity: str
    start: int
    length: int

    def __post_init__(self) -> None:
        if not self.identity:
            raise ConfigError(f"a {self.kind} span needs an identity (its content hash)")
        if self.start < 0 or self.length <= 0:
            raise ConfigError(f"a {self.kind} span needs start >= 0 and length > 0")


@dataclass(frozen=True, eq=False)
class PromptEmbeds:
    """A prompt given as embeddings: one row of bytes per prompt position.

    ``rows`` is a 2-D ``uint8`` array (position × the row's bytes); ``dtype`` names the element
    type the bytes hold; ``mask``, where a prompt mixes token ids and embeddings, is True at the
    positions whose token id is the input (those rows are ignored by the model).
    """

    rows: np.ndarray
    dtype: str
    mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.rows.ndim != 2 or self.rows.dtype != np.uint8:
            raise ConfigError("prompt embeddings are keyed as a 2-D uint8 array of rows")
        if self.mask is not None and self.mask.shape != (self.rows.shape[0],):
            raise ConfigError("a prompt-embeddings mask has one entry per row")

    def digest(self, start: int, end: int) -> bytes:
        """xxh3-128 of the rows (and mask) of positions ``[start, end)``."""
        h = xxhash.xxh3_128(f"{self.dtype}\x00{self.rows.shape[1]}\x00".encode())
        h.update(np.ascontiguousarray(self.rows[start:end]).tobytes())
        if self.mask is not None:
            h.update(np.ascontiguousarray(self.mask[start:end], dtype=np.uint8).tobytes())
        return h.digest()


@dataclass(frozen=True, eq=False)
class KeyInputs:
    """What besides token ids changes a request's KV, and so enters its chunk keys.

    ``adapter`` (a LoRA adapter's identity) enters every chunk; ``salt`` (a cache salt) enters
    the first chunk, and through the chain every key after it; each of ``spans`` enters every
    chunk it overlaps, with its offset from the chunk's first token; ``embeds`` enters each chunk
    it covers as a digest of that chunk's rows. A request with none of them keys exactly as
    plain token ids do.
    """

    adapter: str = ""
    salt: str = ""
    spans: tuple[Span, ...] = ()
    embeds: PromptEmbeds | None = None

    @property
    def empty(self) -> bool:
        """True when nothing but token ids enters the keys."""
        return not (self.adapter or self.salt or self.spans or self.embeds is not None)

    def kinds(self) -> list[str]:
        """The kinds of input present (for records and logs): adapter, salt, mm, embeds …"""
        out = [k for k, on in (("adapter", self.adapter), ("salt", self.salt)) if on]
        out += sorted({s.kind for s in self.spans})
        if self.embeds is not None:
            out.append("embeds")
        return out

    def parts(self, start: int, end: int) -> list[bytes]:
        """The tagged byte strings that enter the key of the chunk of tokens ``[start, end)``."""
        out: list[bytes] = []
        if self.adapter:
            out.append(b"adapter\x00" + self.adapter.encode())
        if self.salt and start == 0:
            out.append(b"salt\x00" + self.salt.encode())
        for span in self.spans:
            if span.start < end and start < span.start + span.length:
                offset = (span.start - start).to_bytes(8, "little", signed=True)
                length = span.length.to_bytes(8, "little")
                out.append(span.kind.encode() + b"\x00" + offset + length + span.identity.encode())
        if self.embeds is not None and start < self.embeds.rows.shape[0]:
            out.append(b"embeds\x00" + self.embeds.digest(start, end))
        return out


#: A request with nothing but token ids.
PLAIN = KeyInputs()


class ChunkKeyer:
    """Cuts token ids into fixed chunks and gives each chunk its chained key."""

    def __init__(self, namespace: Namespace, chunk_tokens: int = 256):
        if chunk_tokens <= 0:
            raise ConfigError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.namespace = namespace
        self.chunk_tokens = chunk_tokens
        self._ns = namespace.id
        self._plain_prefix = self._ns + (0).to_bytes(4, "little")

    def chunk_count(self, n_tokens: int, partial: bool = False) -> int:
        """Chunks in ``n_tokens`` tokens (the last partial chunk only if ``partial``)."""
        full, rest = divmod(n_tokens, self.chunk_tokens)
        return full + (1 if partial and rest else 0)

    def keys(
        self,
        token_ids: Sequence[int] | np.ndarray,
        inputs: KeyInputs = PLAIN,
        partial: bool = False,
    ) -> list[bytes]:
        """Keys of every full chunk of ``token_ids`` (and the partial tail if ``partial``).

        ``inputs`` (adapter, salt, multimodal spans, prompt embeddings) enter the keys of the
        chunks they concern; see :class:`KeyInputs`.
        """
        raw = np.asarray(token_ids)
        if raw.ndim != 1:
            raise ConfigError("token_ids must be one flat sequence")
        # a silent wrap (-1 → 2**32-1, 1.7 → 1) would let two token sequences share a key
        if (
            raw.size
            and raw.dtype != np.dtype("<u4")
            and (raw.dtype.kind not in "ui" or raw.min() < 0 or raw.max() > 0xFFFFFFFF)
        ):
            raise ConfigError("token_ids must be integers in [0, 2**32); got out-of-range ids")
        tokens = np.ascontiguousarray(raw, dtype="<u4")
        parent = ROOT
        out: list[bytes] = []
        n = self.chunk_tokens
        for i in range(self.chunk_count(len(tokens), partial)):
            chunk = tokens[i * n : (i + 1) * n]
            h = xxhash.xxh3_128(self._prefix(inputs.parts(i * n, i * n + len(chunk))))
            h.update(parent)
            h.update(chunk.tobytes())
            parent = h.digest()
            out.append(parent)
        return out

    def _prefix(self, parts: list[bytes]) -> bytes:
        """Namespace id, then the chunk's extra inputs, counted and length-prefixed, so no
        choice of inputs can shift bytes into the chunk's tokens (none: the plain prefix)."""
        if not parts:
            return self._plain_prefix
        framed = b"".join(len(p).to_bytes(4, "little") + p for p in parts)
        return self._ns + len(parts).to_bytes(4, "little") + framed
