"""Measure this machine for the cost model: prefill/decode of a real model, tier loads, copies.

What is measured is what the HF engine does: prefill of N new tokens after P cached ones
(``logits_to_keep=1``, as the engine runs it), single-token decode steps, loads of k chunks
through a one-tier :class:`~kvtier.cache.TieredCache` into the engine's host staging buffer,
and the copy from that buffer into the tensors the model reads. Each point is the fastest of a
few repeats; the fits live in :mod:`kvtier.cost.calibration`.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import torch
import xxhash
from transformers import DynamicCache

from kvtier.cache import CacheConfig, TieredCache
from kvtier.cost.calibration import (
    CalibrationError,
    CalibrationProfile,
    ProfileModel,
    TierFit,
    fit_decode,
    fit_prefill,
    fit_transfer,
)
from kvtier.engines.hf import forward_keywords
from kvtier.engines.kv_layout import HostStaging, KVBuffer, KVLayout, chunks_to_kv
from kvtier.errors import ConfigError
from kvtier.specs.host import cpu_model

#: progress(stage, done, total): called as each measurement finishes.
Progress = Callable[[str, int, int], None]


def _quiet(stage: str, done: int, total: int) -> None:
    return None


@dataclass(frozen=True)
class CalibrationPlan:
    """How much to measure. Defaults take well under a minute for a small model on a CPU.

    Prefill lengths double from ``min_tokens`` to ``max_tokens`` while the measured times stay
    within ``compute_budget_s``; points with a cached prefix reuse the longest prefill's cache.
    """

    max_tokens: int = 1024
    min_tokens: int = 16
    compute_budget_s: float = 40.0
    repeats: int = 2
    chunk_tokens: int = 256
    load_chunks: tuple[int, ...] = (1, 2, 4, 8, 16)
    load_repeats: int = 3
    decode_steps: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ConfigError("calibration needs 1 <= min_tokens <= max_tokens")
        if self.compute_budget_s <= 0 or self.repeats < 1 or self.load_repeats < 1:
            raise ConfigError("calibration budget and repeats must be positive")
        if self.chunk_tokens < 1 or not self.load_chunks or min(self.load_chunks) < 1:
            raise ConfigError("calibration chunk sizes and counts must be positive")
        if self.decode_steps < 1:
            raise ConfigError("calibration needs at least one decode step")

    def lengths(self) -> list[int]:
        """Prefill lengths to try, doubling, ending at ``max_tokens``."""
        out, n = [], self.min_tokens
        while n < self.max_tokens:
            out.append(n)
            n *= 2
        return [*out, self.max_tokens]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(model, ids: torch.Tensor, cache) -> torch.Tensor:
    cache_kw, keep = forward_keywords(model)
    kwargs = {cache_kw: cache, "use_cache": True}
    if keep:
        kwargs["logits_to_keep"] = 1
    return model(ids, **kwargs).logits


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def measure_compute(
    model, plan: CalibrationPlan, progress: Progress = _quiet
) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, float]]]:
    """(prefill samples (new, cached, s), decode samples (context, batch, s)) of ``model``."""
    device = model.device
    lengths = plan.lengths()
    gen = torch.Generator().manual_seed(plan.seed)
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    ids = torch.randint(0, vocab, (1, plan.max_tokens + 128), generator=gen).to(device)
    prefill: list[tuple[int, int, float]] = []
    decode: list[tuple[int, int, float]] = []
    total = len(lengths) + 5
    step = 0
    with torch.inference_mode():
        _forward(model, ids[:, :8], DynamicCache(config=model.config))  # warm-up
        spent, last, longest = 0.0, None, None
        for n in lengths:
            if last is not None and len(prefill) >= 3:
                guess = last[1] * n / last[0] * 1.1
                if spent + guess > plan.compute_budget_s * 0.7:
                    break
            best = float("inf")
            for r in range(plan.repeats):
                cache = DynamicCache(config=model.config)
                t = _timed(lambda c=cache, k=n: _forward(model, ids[:, :k], c), device)
                spent += t
                best = min(best, t)
                if t > 2.0 and r == 0:
                    break
            prefill.append((n, 0, best))
            last, longest = (n, best), (n, cache)
            step += 1
            progress("prefill", step, total)
        big, cache = longest
        for n, cached in ((16, big), (64, big), (64, big // 2)):
            cache.crop(cached - cache.get_seq_length())
            best = float("inf")
            for _ in range(plan.repeats):
                new = ids[:, cached : cached + n]
                best = min(best, _timed(lambda c=cache, x=new: _forward(model, x, c), device))
                cache.crop(cached - cache.get_seq_length())
            prefill.append((n, cached, best))
            step += 1
            progress("prefill", step, total)
        for context in (big // 2, 16):
            cache.crop(context - cache.get_seq_length())
            decode.append((context, 1, _decode_step(model, ids[:, context:], cache, plan, device)))
        pair = DynamicCache(config=model.config)
        _forward(model, ids[:, :32].repeat(2, 1), pair)
        decode.append((32, 2, _decode_step(model, ids[:, 32:].repeat(2, 1), pair, plan, device)))
        step += 2
        progress("decode", step, total)
    return prefill, decode


def _decode_step(model, tokens: torch.Tensor, cache, plan: CalibrationPlan, device) -> float:
    best = float("inf")
    for i in range(plan.decode_steps):
        tok = tokens[:, i : i + 1]
        best = min(best, _timed(lambda c=cache, x=tok: _forward(model, x, c), device))
    return best


def measure_device_copy(
    layout: KVLayout, plan: CalibrationPlan, device: torch.device | str
) -> list[tuple[int, float]]:
    """(bytes, s) of copying k staged chunks into the engine's reusable KV buffer on ``device``."""
    device = torch.device(device)
    staging = HostStaging(layout, plan.chunk_tokens, capacity=max(plan.load_chunks))
    buffer = KVBuffer(layout, plan.chunk_tokens, device)
    buffer.take(max(plan.load_chunks)).fill_(0)  # allocated and touched once, as in the engine
    for out in staging.outs(staging.capacity):
        out[:] = 1
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    samples = []
    for k in plan.load_chunks:
        chunks, dest = staging.chunks(k), buffer.take(k)
        best = min(
            _timed(lambda c=chunks, o=dest: chunks_to_kv(c, device, stream, o), device)
            for _ in range(plan.load_repeats)
        )
        samples.append((k * staging.chunk_bytes, best))
    return samples


def calibration_keys(count: int) -> list[bytes]:
    """Keys of the synthetic blocks calibration writes (never those of real prompts)."""
    return [xxhash.xxh3_128_digest(f"kvtier-calibration\x00{i}".encode()) for i in range(count)]


def kv_like_chunk(layout: KVLayout, chunk_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """A synthetic chunk shaped and scaled like KV (a normal value per element, one power-of-two
    scale per channel), as bytes: what a tier's codec sees from a real model, roughly."""
    shape = layout.chunk_shape(chunk_tokens)
    scale = np.exp2(rng.integers(-6, 3, size=(*shape[:-2], 1, shape[-1])))
    x = torch.from_numpy((rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32))
    return x.to(layout.dtype).contiguous().view(torch.uint8).reshape(-1).numpy().copy()


def measure_tier_load(
    tier, layout: KVLayout, plan: CalibrationPlan
) -> tuple[list[tuple[int, float]], tuple[str, ...], float]:
    """(bytes, s) of loading k chunks from ``tier`` through a TieredCache, the tier's notes and
    the codec ratio it reached (raw bytes per stored byte).

    Writes ``max(plan.load_chunks)`` KV-like chunks (:func:`kv_like_chunk`, so a coded tier
    codes them as it would real KV), reads them back, then deletes them.
    """
    count = max(plan.load_chunks)
    keys = calibration_keys(count)
    meta = layout.meta(plan.chunk_tokens)
    rng = np.random.default_rng(plan.seed)
    chunk_bytes = layout.chunk_bytes(plan.chunk_tokens)
    payloads = [kv_like_chunk(layout, plan.chunk_tokens, rng) for _ in range(count)]
    cache = TieredCache([tier], CacheConfig(chunk_tokens=plan.chunk_tokens, queue_chunks=count))
    staging = HostStaging(layout, plan.chunk_tokens, capacity=count)
    outs = staging.outs(count)
    used_before = tier.usage().used_bytes
    try:
        cache.store(keys, payloads, meta, copy=False)
        if not cache.flush(timeout=300) or cache.lookup(keys).hit_chunks < count:
            raise CalibrationError(
                f"tier {tier.name!r} did not keep {count} chunks of {chunk_bytes} bytes; "
                "give it more room (?size=...) or calibrate with fewer/smaller chunks"
            )
        stored = tier.usage().used_bytes - used_before
        ratio = count * chunk_bytes / stored if stored > 0 else 1.0
        samples = []
        for k in plan.load_chunks:
            best = float("inf")
            for _ in range(plan.load_repeats):
                start = time.perf_counter()
                result = cache.load(keys[:k], outs[:k])
                elapsed = time.perf_counter() - start
                if result.loaded != k:
                    raise CalibrationError(f"tier {tier.name!r} lost calibration chunks")
                best = min(best, elapsed)
            samples.append((k * chunk_bytes, best))
        if not np.array_equal(outs[0], payloads[0]):
            raise CalibrationError(f"tier {tier.name!r} returned other bytes than were stored")
    finally:
        cache.close()
        tier.delete_many(keys)
    notes = tuple(getattr(tier.usage(), "notes", ()) or ())
    return samples, notes, ratio


def host_info(device: torch.device) -> dict[str, object]:
    """What the measurements ran on (no host names)."""
    import transformers

    info: dict[str, object] = {
        "machine": platform.machine(),
        "processor": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def calibrate(
    loaded,
    tiers: Sequence[tuple[str, object]] = (),
    plan: CalibrationPlan | None = None,
    progress: Progress = _quiet,
) -> CalibrationProfile:
    """Measure ``loaded`` (a LoadedModel) and the ``(url, tier)`` pairs; fit a profile.

    The tiers should be opened for a namespace of their own (calibration writes synthetic
    blocks and deletes them afterwards).
    """
    plan = plan or CalibrationPlan()
    model = loaded.model
    layout = KVLayout.from_model(model)
    prefill, decode = measure_compute(model, plan, progress)
    copies = measure_device_copy(layout, plan, model.device)
    progress("device copy", 1, 1)
    fits = {}
    for i, (url, tier) in enumerate(tiers):
        samples, notes, ratio = measure_tier_load(tier, layout, plan)
        codec = getattr(tier, "codec", "raw")
        fits[tier.name] = TierFit(tier.name, url, fit_transfer(samples), notes, codec, ratio)
        progress("tiers", i + 1, len(tiers))
    return CalibrationProfile(
        model=ProfileModel.of(
            layout.identity(loaded.model_id, loaded.fingerprint),
            kv_bytes_per_token=layout.bytes_per_token,
            chunk_tokens=plan.chunk_tokens,
        ),
        prefill=fit_prefill(prefill),
        decode=fit_decode(decode),
        device_copy=fit_transfer(copies),
        tiers=fits,
        host=host_info(model.device),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
