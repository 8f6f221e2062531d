"""KV chunk layout: DynamicCache layers ⇄ contiguous chunks ⇄ staging buffer, without the model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvtier.codec import pack_block, unpack_into  # noqa: E402
from kvtier.engines.kv_layout import (  # noqa: E402
    HostStaging,
    KVLayout,
    UnsupportedCacheError,
    chunk_payloads,
    chunks_to_kv,
    dtype_name,
    kv_to_cache,
    layers_to_chunks,
)
from kvtier.errors import ConfigError  # noqa: E402

LAYERS, KV, HD, C = 3, 2, 8, 4


def _layers(tokens: int, dtype):
    gen = torch.Generator().manual_seed(7)
    return [
        tuple(torch.randn(1, KV, tokens, HD, generator=gen).to(dtype) for _ in range(2))
        for _ in range(LAYERS)
    ]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_chunks_round_trip_through_block_bytes(dtype):
    layout = KVLayout(LAYERS, KV, HD, dtype)
    layers = _layers(3 * C + 2, dtype)
    chunks = layers_to_chunks(layers, layout, C, 0, 3)
    assert chunks.shape == (3, *layout.chunk_shape(C))
    assert chunks[1, 2, 1, 0, 3].equal(layers[2][1][0, 0, C + 3])  # chunk 1, layer 2, values
    ns, meta = b"n" * 16, layout.meta(C)
    assert meta.dtype == dtype_name(dtype) and meta.shape == (LAYERS, 2, KV, C, HD)
    staging = HostStaging(layout, C)
    outs = staging.outs(3)
    for i, payload in enumerate(chunk_payloads(chunks)):
        assert payload.nbytes == layout.chunk_bytes(C)
        header, stored = pack_block(ns, bytes([i]) * 16, payload, meta)
        unpack_into(header + bytes(stored), outs[i], ns, bytes([i]) * 16)
    kv = chunks_to_kv(staging.chunks(3), "cpu")
    cache = kv_to_cache(kv)
    assert cache.get_seq_length() == 3 * C
    for (k, v), layer in zip(layers, cache.layers, strict=True):
        assert layer.keys.equal(k[:, :, : 3 * C]) and layer.values.equal(v[:, :, : 3 * C])
        assert layer.keys.data_ptr() >= kv.data_ptr()  # views of one tensor, not copies
        assert layer.keys.untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()


def test_middle_chunks_and_staging_growth():
    layout = KVLayout(LAYERS, KV, HD, torch.float32)
    layers = _layers(5 * C, torch.float32)
    chunks = layers_to_chunks(layers, layout, C, 2, 4)
    assert chunks[0, 0, 0].equal(layers[0][0][0, :, 2 * C : 3 * C])
    staging = HostStaging(layout, C, capacity=1)
    assert staging.capacity == 1
    staging.outs(3)
    assert staging.capacity >= 3
    assert layers_to_chunks(layers, layout, C, 4, 4).shape[0] == 0


def test_too_short_or_wrong_dtype_is_refused():
    layout = KVLayout(LAYERS, KV, HD, torch.float32)
    with pytest.raises(UnsupportedCacheError):
        layers_to_chunks(_layers(C, torch.float32), layout, C, 0, 2)
    with pytest.raises(UnsupportedCacheError):
        layers_to_chunks(_layers(2 * C, torch.bfloat16), layout, C, 0, 1)
    with pytest.raises(ConfigError):
        dtype_name(torch.int8)


def test_cache_from_views_grows_by_concatenation():
    """A rebuilt cache behaves like one built by update(): new tokens append, views stay intact."""
    layout = KVLayout(LAYERS, KV, HD, torch.float32)
    layers = _layers(2 * C, torch.float32)
    kv = chunks_to_kv(layers_to_chunks(layers, layout, C, 0, 2), "cpu")
    before = kv.clone()
    cache = kv_to_cache(kv)
    extra = torch.ones(1, KV, 1, HD)
    keys, _ = cache.layers[0].update(extra, extra)
    assert keys.shape[2] == 2 * C + 1 and cache.get_seq_length() == 2 * C + 1
    assert kv.equal(before)
