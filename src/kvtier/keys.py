"""Token ids → chained, keyed, model-fingerprinted block keys.

A key is 16 bytes: xxh3-128 over (namespace id, parent key, extra keys, the chunk's token ids as
little-endian uint32). The namespace id itself hashes the model fingerprint, KV dtype and layout,
tensor-parallel placement and an optional tenant salt, so two namespaces never share a key.
Nothing here depends on PYTHONHASHSEED or on the process: the same inputs give the same keys
on every machine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import xxhash

from kvtier.errors import ConfigError
from kvtier.specs.model import ModelSpec

KEY_BYTES = 16
ROOT = b"\x00" * KEY_BYTES


@dataclass(frozen=True)
class Namespace:
    """Everything that makes one KV block incompatible with another of the same tokens.

    ``fingerprint`` is a hash of the weights or a user-given revision; ``layout`` names the
    page/tensor layout of the stored bytes (e.g. ``"layer-kv-head-token-dim"``).
    """

    model_id: str
    fingerprint: str
    kv_dtype: str
    layers: int
    kv_heads: int
    head_dim: int
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


class ChunkKeyer:
    """Cuts token ids into fixed chunks and gives each chunk its chained key."""

    def __init__(self, namespace: Namespace, chunk_tokens: int = 256):
        if chunk_tokens <= 0:
            raise ConfigError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.namespace = namespace
        self.chunk_tokens = chunk_tokens
        self._ns = namespace.id

    def chunk_count(self, n_tokens: int, partial: bool = False) -> int:
        """Chunks in ``n_tokens`` tokens (the last partial chunk only if ``partial``)."""
        full, rest = divmod(n_tokens, self.chunk_tokens)
        return full + (1 if partial and rest else 0)

    def keys(
        self,
        token_ids: Sequence[int] | np.ndarray,
        extra: Sequence[bytes | str] = (),
        partial: bool = False,
    ) -> list[bytes]:
        """Keys of every full chunk of ``token_ids`` (and the partial tail if ``partial``).

        ``extra`` (LoRA id, multimodal hashes …) enters every key of the chain.
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
        # Length-prefixed, so no choice of extra keys can shift bytes into the chunk's tokens.
        parts = [e.encode() if isinstance(e, str) else bytes(e) for e in extra]
        salt = b"".join(len(p).to_bytes(4, "little") + p for p in parts)
        prefix = self._ns + len(parts).to_bytes(4, "little") + salt
        parent = ROOT
        out: list[bytes] = []
        for i in range(self.chunk_count(len(tokens), partial)):
            chunk = tokens[i * self.chunk_tokens : (i + 1) * self.chunk_tokens]
            h = xxhash.xxh3_128(prefix)
            h.update(parent)
            h.update(chunk.tobytes())
            parent = h.digest()
            out.append(parent)
        return out
