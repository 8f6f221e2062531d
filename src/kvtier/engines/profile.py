"""The calibration profile a run decides with: the saved one when it fits, else measured now.

A saved profile (``kvtier calibrate``, default path) is used when it was measured with this
model (id, weights fingerprint, KV dtype and geometry) on this kind of host (device, torch
threads). Its tier fits are matched to the run's tiers by name, then by URL scheme; a tier it
lacks is measured now (a few loads of synthetic chunks), and so is everything when no profile
fits: a short calibration of the prefill curve, the copy into the model's KV and each tier.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvtier.cost.calibration import (
    CalibrationError,
    CalibrationProfile,
    TierFit,
    default_profile_path,
    fit_prefill,
    fit_transfer,
)
from kvtier.cost.model import CostModel
from kvtier.keys import Namespace
from kvtier.tiers.base import TierURL


@dataclass(frozen=True)
class QuickPlan:
    """How much a run measures when no saved profile fits (kept short: about 15 s on a CPU).

    ``context_tokens``: cached lengths at which a few new tokens are timed (after synthetic KV,
    so no long prefill is needed) until the profile covers the longest of them; ``full_tokens``:
    prompt lengths prefilled from scratch until the profile covers the longest of them. With
    either, the prefill curve is fitted with context terms (see :class:`PrefillFit`).
    """

    max_tokens: int = 512
    compute_budget_s: float = 12.0
    repeats: int = 2
    load_chunks: tuple[int, ...] = (1, 2, 4, 8)
    load_repeats: int = 3
    context_tokens: tuple[int, ...] = (1024,)
    full_tokens: tuple[int, ...] = ()
    context_new: tuple[int, ...] = (16, 64)
    context_repeats: int = 2


@dataclass
class ProfileInfo:
    """Where the run's profile came from."""

    source: str  # "loaded", "loaded+measured" or "measured"
    path: str | None
    reason: str  # why the saved one was (not) used
    measured: list[str] = field(default_factory=list)  # tiers (and curves) measured now
    seconds: float = 0.0

    def as_dict(self) -> dict:
        """JSON-ready dict."""
        return dict(self.__dict__)


def mismatch(profile: CalibrationProfile, loaded, device: str, threads: int) -> str | None:
    """Why ``profile`` does not describe ``loaded`` on this host (None: it does)."""
    from kvtier.engines.kv_layout import KVLayout

    m = profile.model
    layout = KVLayout.from_model(loaded.model)
    if (m.model_id, m.fingerprint) != (loaded.model_id, loaded.fingerprint):
        return f"measured with model {m.model_id} ({m.fingerprint[:12]})"
    if m.kv_dtype != layout.dtype_name or m.kv_bytes_per_token != layout.bytes_per_token:
        return f"measured with KV {m.kv_dtype}, {m.kv_bytes_per_token} B/token"
    if str(profile.host.get("device", device)) != device:
        return f"measured on {profile.host.get('device')}"
    if int(profile.host.get("threads", threads)) != threads:
        return f"measured with {profile.host.get('threads')} torch threads, now {threads}"
    return None


def _scheme(url: str) -> str:
    return TierURL.parse(url).scheme


def match_tiers(
    profile: CalibrationProfile, tiers: Sequence[tuple[str, object]]
) -> tuple[dict[str, TierFit], list[tuple[str, object]]]:
    """(fits renamed to the run's tier names, the (url, tier) pairs the profile lacks)."""
    fits: dict[str, TierFit] = {}
    missing = []
    used: set[str] = set()
    for url, tier in tiers:
        name = tier.name
        fit = profile.tiers.get(name)
        if fit is None or name in used:
            fit = next(
                (
                    f
                    for n, f in profile.tiers.items()
                    if n not in used and _scheme(f.url) == _scheme(url)
                ),
                None,
            )
        if fit is None:
            missing.append((url, tier))
            continue
        used.add(fit.name)
        fits[name] = TierFit(name, fit.url, fit.load, fit.notes)
    return fits, missing


def roomy(url: str, need: int) -> str:
    """``url`` with its ``size=`` raised to at least ``need`` bytes (calibration's own copy of
    a small tier must hold the chunks it times); other URLs, and URLs its tier would refuse
    (left for opening it to report), unchanged."""
    from kvtier.errors import ConfigError
    from kvtier.tiers.base import TierURL
    from kvtier.tiers.registry import options_class, replace_options
    from kvtier.tiers.url import parse_options

    try:
        parsed = TierURL.parse(url)
        cls = options_class(parsed.scheme)
        size = getattr(parse_options(cls, parsed), "size", None) if cls else None
        if not isinstance(size, int) or size >= need:
            return url
        return replace_options(url, size=need)
    except ConfigError:
        return url


def calibration_namespace(kv_dtype: str) -> Namespace:
    """The namespace calibration blocks live in (never that of real KV)."""
    return Namespace("kvtier-calibration", "synthetic", kv_dtype, 1, 1, 1)


def obtain_profile(
    loaded,
    tier_urls: Sequence[tuple[str, str]],
    chunk_tokens: int,
    *,
    path: Path | None = None,
    force: bool = False,
    plan: QuickPlan | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[CalibrationProfile, ProfileInfo]:
    """A profile covering every ``(url, tier name)`` of the run, and where it came from.

    ``path``: the saved profile to try (default: :func:`default_profile_path`); ``force``
    measures even when a saved one fits. Tiers are measured on fresh instances opened from the
    same URLs in the calibration namespace, so the run's tiers never see synthetic blocks.
    """
    import torch

    from kvtier.engines.calibrate import (
        CalibrationPlan,
        calibrate,
        measure_device_copy,
        measure_tier_load,
    )
    from kvtier.engines.kv_layout import KVLayout
    from kvtier.tiers.registry import open_tier

    began = time.perf_counter()
    plan = plan or QuickPlan()
    note = progress or (lambda stage: None)
    device = str(loaded.model.device)
    threads = torch.get_num_threads()
    layout = KVLayout.from_model(loaded.model)
    file = Path(path) if path else default_profile_path()
    profile, reason = None, "measured at start (--calibrate)"
    if not force:
        try:
            profile = CalibrationProfile.load(file)
            why = mismatch(profile, loaded, device, threads)
            if why is not None:
                profile, reason = None, f"saved profile {why}"
            else:
                reason = "saved profile matches this model and host"
        except CalibrationError as exc:
            reason = str(exc).split(";")[0]
    cal = CalibrationPlan(
        max_tokens=plan.max_tokens,
        compute_budget_s=plan.compute_budget_s,
        repeats=plan.repeats,
        chunk_tokens=chunk_tokens,
        load_chunks=plan.load_chunks,
        load_repeats=plan.load_repeats,
        decode_steps=2,
    )
    ns = calibration_namespace(layout.dtype_name)
    need = 2 * max(cal.load_chunks) * (layout.chunk_bytes(chunk_tokens) + 8192)
    opened = []
    try:
        if profile is None:
            note("calibrating compute")
            base = calibrate(loaded, (), cal)
            source = "measured"
            fits: dict[str, TierFit] = {}
            missing = []
            for url, name in tier_urls:
                tier = open_tier(roomy(url, need), ns.id)
                tier.name = name
                opened.append(tier)
                missing.append((url, tier))
        else:
            base = profile
            source = "loaded"
            stand_ins = [(url, _Named(name)) for url, name in tier_urls]
            fits, lacking = match_tiers(profile, stand_ins)
            missing = []
            for url, stub in lacking:
                tier = open_tier(roomy(url, need), ns.id)
                tier.name = stub.name
                opened.append(tier)
                missing.append((url, tier))
            if missing:
                source = "loaded+measured"
        measured = []
        for url, tier in missing:
            note(f"calibrating {tier.name}")
            samples, notes, ratio = measure_tier_load(tier, layout, cal)
            fits[tier.name] = TierFit(
                tier.name, url, fit_transfer(samples), notes, tier.codec, ratio
            )
            measured.append(tier.name)
        copy = base.device_copy
        if copy is None:
            copy = fit_transfer(measure_device_copy(layout, cal, loaded.model.device))
        prefill = base.prefill
        extra = context_samples(loaded, prefill.samples, plan, note)
        if extra:
            prefill = fit_prefill([*prefill.samples, *extra], context_terms=True)
            measured.append("prefill context")
            if source == "loaded":
                source = "loaded+measured"
    finally:
        for tier in opened:
            tier.close()
    result = replace(base, tiers=fits, device_copy=copy, prefill=prefill)
    info = ProfileInfo(
        source=source,
        path=str(file) if source != "measured" else None,
        reason=reason,
        measured=measured,
        seconds=time.perf_counter() - began,
    )
    return result, info


def context_samples(
    loaded, have: Sequence[tuple[int, int, float]], plan: QuickPlan, note=None
) -> list[tuple[int, int, float]]:
    """Prefill samples the profile lacks to cover ``plan``'s contexts and full prompt lengths.

    Returns nothing when the samples ``have`` already reach the longest cached and full lengths
    asked for. Cached points time ``plan.context_new`` tokens after random KV of each length
    (attention costs the same whatever the values); full points prefill random tokens.
    """
    import torch
    from transformers import DynamicCache

    from kvtier.engines.hf import forward_keywords
    from kvtier.engines.kv_layout import KVLayout, kv_to_cache

    longest_cached = max((p for _, p, _ in have), default=0)
    longest_full = max((n for n, p, _ in have if p == 0), default=0)
    contexts = sorted(t for t in plan.context_tokens if t > longest_cached)
    fulls = sorted(t for t in plan.full_tokens if t > longest_full)
    if not contexts and not fulls:
        return []
    model = loaded.model
    layout = KVLayout.from_model(model)
    cache_kw, keep = forward_keywords(model)
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (1, max([*fulls, *plan.context_new])), generator=gen)
    ids = ids.to(model.device)

    def timed(tokens, cache) -> float:
        kwargs = {cache_kw: cache, "use_cache": True}
        if keep:
            kwargs["logits_to_keep"] = 1
        start = time.perf_counter()
        model(tokens, **kwargs)
        return time.perf_counter() - start

    out = []
    with torch.inference_mode():
        timed(ids[:, :8], DynamicCache(config=model.config))  # warm-up
        for cached in contexts:
            if note:
                note(f"calibrating prefill after {cached} cached tokens")
            shape = (layout.layers, 2, layout.kv_heads, cached, layout.head_dim)
            kv = (torch.randn(shape, generator=gen) * 0.5).to(layout.dtype).to(model.device)
            for new in plan.context_new:
                best = min(
                    timed(ids[:, :new], kv_to_cache(kv, model.config))
                    for _ in range(max(plan.context_repeats, 1))
                )
                out.append((new, cached, best))
        for n in fulls:
            if note:
                note(f"calibrating a {n}-token prefill")
            out.append((n, 0, timed(ids[:, :n], DynamicCache(config=model.config))))
    return out


@dataclass(frozen=True)
class _Named:
    name: str


def break_even(profile: CalibrationProfile, max_tokens: int = 1 << 20) -> dict[str, int | None]:
    """Per tier: the shortest prefix whose reload beats its recompute (None: never)."""
    cost = CostModel(profile.compute, profile.model.kv_bytes_per_token)
    return {name: cost.break_even_tokens(profile.path(name), max_tokens) for name in profile.tiers}
