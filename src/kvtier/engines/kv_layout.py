"""KV chunk layout: between transformers' DynamicCache and kvtier's contiguous chunk buffers.

A stored chunk is one contiguous buffer of shape (layers, 2, kv_heads, chunk_tokens, head_dim)
in the model's KV dtype (index 0 of the second axis: keys, 1: values). Loading reads chunks
straight into one preallocated host staging buffer (pinned when CUDA is available), then one
copy per request moves them, transposed to (layers, 2, kv_heads, tokens, head_dim), into the
tensors the DynamicCache holds as views: on CUDA that copy is the host→device copy on a side
stream, on the CPU a plain memcpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvtier.codec import BlockMeta
from kvtier.errors import ConfigError, KvtierError
from kvtier.specs.model import KVIdentity

LAYOUT = "layer-kv-head-token-dim"
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


class UnsupportedCacheError(KvtierError):
    """The model's KV cache is not a plain per-layer key/value cache kvtier can chunk."""


def dtype_name(dtype: torch.dtype) -> str:
    """kvtier's name of a torch KV dtype (``bf16``, ``fp16``, ``fp32``)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ConfigError(
            f"KV dtype {dtype} is not supported; load the model in bf16, fp16 or fp32"
        ) from None


@dataclass(frozen=True)
class KVLayout:
    """KV geometry of one model: layers, KV heads, head dim and dtype."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def from_model(cls, model) -> KVLayout:
        """The layout of an HF causal LM's KV (from its text config and dtype)."""
        cfg = model.config.get_text_config(decoder=True)
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        dtype = model.dtype
        dtype_name(dtype)
        return cls(int(cfg.num_hidden_layers), kv, head_dim, dtype)

    @property
    def dtype_name(self) -> str:
        """kvtier dtype name of the KV (``bf16`` …)."""
        return dtype_name(self.dtype)

    def identity(self, model_id: str, fingerprint: str) -> KVIdentity:
        """This KV's identity as the model ``model_id`` with weights ``fingerprint`` has it."""
        return KVIdentity(
            model_id, fingerprint, self.dtype_name, self.layers, self.kv_heads, self.head_dim
        )

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token over all layers, keys and values."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.element_bytes

    def chunk_shape(self, chunk_tokens: int) -> tuple[int, int, int, int, int]:
        """Shape of one stored chunk."""
        return (self.layers, 2, self.kv_heads, chunk_tokens, self.head_dim)

    def chunk_bytes(self, chunk_tokens: int) -> int:
        """Bytes of one stored chunk."""
        return self.bytes_per_token * chunk_tokens

    def meta(self, chunk_tokens: int) -> BlockMeta:
        """BlockMeta of a stored chunk."""
        return BlockMeta(dtype=self.dtype_name, shape=self.chunk_shape(chunk_tokens))


class HostStaging:
    """A reusable host buffer for up to ``capacity`` chunks; pinned when CUDA is available.

    ``outs(n)`` gives one writable buffer per chunk for :meth:`TieredCache.load`; ``chunks(n)``
    views the same bytes as a (n, layers, 2, kv_heads, chunk_tokens, head_dim) tensor.
    """

    def __init__(self, layout: KVLayout, chunk_tokens: int, capacity: int = 0):
        self.layout = layout
        self.chunk_tokens = chunk_tokens
        self.chunk_bytes = layout.chunk_bytes(chunk_tokens)
        self.pinned = torch.cuda.is_available()
        self._raw = torch.empty((0, self.chunk_bytes), dtype=torch.uint8)
        self._np = self._raw.numpy()
        if capacity:
            self.reserve(capacity)

    @property
    def capacity(self) -> int:
        """Chunks the buffer holds now."""
        return self._raw.shape[0]

    def reserve(self, chunks: int) -> None:
        """Grow (never shrink) to hold ``chunks`` chunks."""
        if chunks <= self.capacity:
            return
        size = max(chunks, 2 * self.capacity)
        self._raw = torch.empty((size, self.chunk_bytes), dtype=torch.uint8, pin_memory=self.pinned)
        self._np = self._raw.numpy()

    def outs(self, n: int) -> list:
        """``n`` writable per-chunk buffers (numpy uint8 rows of the staging buffer)."""
        self.reserve(n)
        return [self._np[i] for i in range(n)]

    def chunks(self, n: int) -> torch.Tensor:
        """The first ``n`` chunks as a typed (n, layers, 2, kv_heads, chunk_tokens, head_dim)."""
        shape = self.layout.chunk_shape(self.chunk_tokens)
        return self._raw[:n].view(self.layout.dtype).view(n, *shape)


class KVBuffer:
    """A reusable (L, 2, kv_heads, chunks, C, hd) tensor on the model's device for loaded chunks.

    The DynamicCache built from it only feeds the first forward after a load (which concatenates
    the new tokens into fresh tensors), so the buffer is free again once that forward returns.
    Reusing it spares the page faults of a fresh allocation per request.
    """

    def __init__(self, layout: KVLayout, chunk_tokens: int, device: torch.device | str):
        self.layout = layout
        self.chunk_tokens = chunk_tokens
        self.device = torch.device(device)
        self._data: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        """Chunks the buffer holds now."""
        return 0 if self._data is None else self._data.shape[3]

    def take(self, n: int) -> torch.Tensor:
        """A (L, 2, kv_heads, n, C, hd) view for ``n`` chunks (growing the buffer if needed)."""
        if n > self.capacity:
            lay = self.layout
            shape = (lay.layers, 2, lay.kv_heads, max(n, 2 * self.capacity))
            self._data = torch.empty(
                (*shape, self.chunk_tokens, lay.head_dim), dtype=lay.dtype, device=self.device
            )
        return self._data[:, :, :, :n]


def chunks_to_kv(
    chunks: torch.Tensor,
    device: torch.device | str,
    stream: torch.cuda.Stream | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """(n, L, 2, kv, C, hd) host chunks → one (L, 2, kv, n·C, hd) tensor (view) on ``device``.

    ``out`` (e.g. :meth:`KVBuffer.take`) is a (L, 2, kv, n, C, hd) destination; a fresh one is
    allocated when None. One copy on the CPU (the transposing memcpy). On CUDA the pinned host
    chunks are copied on ``stream`` without blocking the host, transposed on the device, and the
    current stream waits for them.
    """
    n, layers, two, kv, c, hd = chunks.shape
    device = torch.device(device)
    shape = (layers, two, kv, n, c, hd)
    if out is not None and tuple(out.shape) != shape:
        raise ConfigError(f"KV destination has shape {tuple(out.shape)}, expected {shape}")
    if device.type != "cuda":
        if out is None:
            out = torch.empty(shape, dtype=chunks.dtype, device=device)
        out.copy_(chunks.permute(1, 2, 3, 0, 4, 5))
        return out.view(layers, two, kv, n * c, hd)
    main = torch.cuda.current_stream(device)
    side = stream or main
    with torch.cuda.stream(side):
        side.wait_stream(main)  # the previous user of ``out`` is done
        staged = chunks.to(device, non_blocking=True)
        if out is None:
            out = torch.empty(shape, dtype=chunks.dtype, device=device)
        out.copy_(staged.permute(1, 2, 3, 0, 4, 5))
    if side is not main:
        main.wait_stream(side)
        out.record_stream(main)
        staged.record_stream(main)
    return out.view(layers, two, kv, n * c, hd)


def kv_to_cache(kv: torch.Tensor, config=None) -> DynamicCache:
    """A DynamicCache whose layers hold views of ``kv`` (L, 2, kv_heads, T, hd): no copy."""
    layers = kv.shape[0]
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    if not cache.layers:  # lazily grown cache (no config): one dynamic layer per KV layer
        cache.layers.extend(DynamicLayer() for _ in range(layers))
    if len(cache.layers) != layers:
        raise UnsupportedCacheError(
            f"the model's cache has {len(cache.layers)} layers but the KV has {layers}"
        )
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise UnsupportedCacheError(
                f"layer {i} of the model's cache is a {type(layer).__name__}; kvtier reuses "
                "prefixes only for full-attention layers (DynamicLayer)"
            )
        keys, values = kv[i, 0].unsqueeze(0), kv[i, 1].unsqueeze(0)
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    tokens = kv.shape[3]
    if cache.get_seq_length() != tokens:
        raise UnsupportedCacheError(
            f"the rebuilt cache reports {cache.get_seq_length()} tokens, expected {tokens}; "
            "this transformers version lays out DynamicCache differently"
        )
    return cache


def cache_to_chunks(
    cache: DynamicCache, layout: KVLayout, chunk_tokens: int, first: int, end: int
) -> torch.Tensor:
    """Chunks ``first … end-1`` of a DynamicCache as one host (n, L, 2, kv, C, hd) tensor."""
    pairs = [(layer.keys, layer.values) for layer in cache.layers]
    return layers_to_chunks(pairs, layout, chunk_tokens, first, end)


def layers_to_chunks(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
    layout: KVLayout,
    chunk_tokens: int,
    first: int,
    end: int,
) -> torch.Tensor:
    """Chunks ``first … end-1`` of per-layer (keys, values) as a host (n, L, 2, kv, C, hd) copy.

    The chunks are gathered on the tensors' device, then copied once to the host (into pinned
    memory when CUDA is available).
    """
    n = end - first
    if n <= 0:
        return torch.empty((0, *layout.chunk_shape(chunk_tokens)), dtype=layout.dtype)
    if len(layers) != layout.layers:
        raise UnsupportedCacheError(f"cache has {len(layers)} layers, the layout {layout.layers}")
    start, stop = first * chunk_tokens, end * chunk_tokens
    device = layers[0][0].device
    out = torch.empty((n, *layout.chunk_shape(chunk_tokens)), dtype=layout.dtype, device=device)
    for i, pair in enumerate(layers):
        for j, t in enumerate(pair):
            if t is None or t.dtype != layout.dtype or t.shape[2] < stop:
                got = "nothing" if t is None else f"{tuple(t.shape)} {t.dtype}"
                raise UnsupportedCacheError(
                    f"layer {i} holds {got}; expected {stop}+ tokens of {layout.dtype}"
                )
            out[:, i, j].copy_(t[0, :, start:stop].unflatten(1, (n, chunk_tokens)).transpose(0, 1))
    if device.type == "cpu":
        return out
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=torch.cuda.is_available())
    host.copy_(out)
    return host


def chunk_payloads(chunks: torch.Tensor) -> list:
    """One contiguous byte buffer (numpy uint8 view, no copy) per chunk of a host chunk tensor."""
    raw = chunks.contiguous().view(torch.uint8).reshape(chunks.shape[0], -1).numpy()
    return [raw[i] for i in range(raw.shape[0])]
