"""Measured calibration: fits of this machine's prefill, decode and load times, saved as JSON.

``kvtier calibrate`` measures; this module fits and stores. A :class:`CalibrationProfile` gives a
:class:`MeasuredCompute` (a ``ComputeModel``) and one :class:`~kvtier.cost.TransferPath` per
measured tier, so the same :class:`~kvtier.cost.CostModel` serves spec-based planning and
measured reality. The fits:

- prefill of N new tokens after P cached ones: ``a + b·N + c·N·(P + N/2)`` seconds
  (fixed cost, per-token linear layers, causal attention); with ``context_terms`` (samples at
  several cached lengths) ``a + b·N + c·N²/2 + e·N·P + d·P``: new tokens may attend to cached
  ones at another rate than to each other (``e``), and every forward touches the cached KV
  once (``d``: on a CPU the KV is copied when the new keys are appended);
- one decode step at context L for a batch B: ``a + B·(b + c·L)``;
- a load of S raw bytes (tier read, or host→device copy): ``latency + S / bandwidth``.

Every coefficient is fitted by non-negative least squares on relative error, so noise on the
small, fast points weighs as much as on the large ones. No pickle: the profile is plain JSON.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.cost.model import CostModel
from kvtier.cost.transfer import TransferPath
from kvtier.errors import ConfigError, KvtierError
from kvtier.specs.model import KVIdentity

PROFILE_VERSION = 1


class CalibrationError(KvtierError):
    """Measurements cannot be fitted, or a profile file cannot be read."""


def default_profile_path() -> Path:
    """Where ``kvtier calibrate`` saves by default: ``$KVTIER_CACHE_DIR`` or ``~/.cache/kvtier``."""
    env = os.environ.get("KVTIER_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "kvtier"
    return root / "profile.json"


def nnls_relative(design: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of ``design @ x ≈ seconds`` on relative error.

    Returns (x, worst relative residual). Exact for the few columns used here: every support
    set is solved and the best one with non-negative coefficients wins.
    """
    design = np.asarray(design, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    if design.ndim != 2 or design.shape[0] != seconds.shape[0]:
        raise CalibrationError("design matrix and measurements do not line up")
    if np.any(seconds <= 0) or not np.all(np.isfinite(seconds)):
        raise CalibrationError("measured times must be positive and finite")
    weights = 1.0 / seconds
    a, y = design * weights[:, None], seconds * weights
    cols = design.shape[1]
    best_x, best_err = None, math.inf
    for size in range(1, cols + 1):
        for support in itertools.combinations(range(cols), size):
            sub = a[:, support]
            if np.linalg.matrix_rank(sub) < size:
                continue
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((sub @ coef - y) ** 2))
            if err < best_err - 1e-15:
                best_err = err
                best_x = np.zeros(cols)
                best_x[list(support)] = coef
    if best_x is None:
        raise CalibrationError("no non-negative fit exists for these measurements")
    worst = float(np.max(np.abs(design @ best_x - seconds) / seconds))
    return best_x, worst


def _need(samples: Sequence, least: int, what: str) -> None:
    if len(samples) < least:
        raise CalibrationError(f"{what}: need at least {least} measurements, got {len(samples)}")


@dataclass(frozen=True)
class PrefillFit:
    """``a + b·N + c·N·(P + N/2)`` seconds to prefill N new tokens after P cached ones.

    With ``d``/``e`` set (a fit with context terms): ``a + b·N + c·N²/2 + e·N·P + d·P``.
    The fit describes one forward. ``step`` > 0 describes an engine that prefills in forwards
    of at most ``step`` tokens cut at multiples of ``step`` (the HF engine's exact mode): the
    prediction is then the sum over those pieces.
    """

    a: float
    b: float
    c: float
    samples: tuple[tuple[int, int, float], ...] = ()
    max_rel_error: float = 0.0
    d: float = 0.0
    e: float | None = None
    step: int = 0

    def seconds(self, new: int, cached: int = 0) -> float:
        """Predicted seconds (0 for nothing new)."""
        if new < 0 or cached < 0:
            raise ConfigError(f"token counts must not be negative, got new={new} cached={cached}")
        if new == 0:
            return 0.0
        if self.step <= 0:
            return self._forward(float(new), float(cached))
        cuts = np.arange((cached // self.step + 1) * self.step, cached + new, self.step)
        starts = np.concatenate(([cached], cuts)).astype(float)
        ends = np.concatenate((cuts, [cached + new])).astype(float)
        return float(np.sum(self._forward(ends - starts, starts)))

    def _forward(self, new, cached):
        pair = self.c if self.e is None else self.e
        return (
            self.a + self.b * new + self.c * new * new / 2 + pair * new * cached + self.d * cached
        )

    def stepped(self, step: int) -> PrefillFit:
        """This fit for an engine that prefills in aligned forwards of ``step`` tokens (0: one)."""
        if step < 0:
            raise ConfigError(f"the prefill step must be >= 0, got {step}")
        return replace(self, step=int(step))


def fit_prefill(
    samples: Sequence[tuple[int, int, float]], context_terms: bool = False
) -> PrefillFit:
    """Fit :class:`PrefillFit` to (new, cached, seconds) measurements.

    ``context_terms`` fits ``d`` and ``e`` too; it needs samples at several cached lengths.
    """
    _need(samples, 5 if context_terms else 3, "prefill fit")
    secs = np.array([s for *_, s in samples])
    kept = tuple((int(n), int(p), float(s)) for n, p, s in samples)
    if context_terms:
        rows = np.array([[1.0, n, n * n / 2, n * p, p] for n, p, _ in samples])
        x, worst = nnls_relative(rows, secs)
        return PrefillFit(
            float(x[0]), float(x[1]), float(x[2]), kept, worst, d=float(x[4]), e=float(x[3])
        )
    rows = np.array([[1.0, n, n * (p + n / 2)] for n, p, _ in samples])
    x, worst = nnls_relative(rows, secs)
    return PrefillFit(float(x[0]), float(x[1]), float(x[2]), kept, worst)


@dataclass(frozen=True)
class DecodeFit:
    """``a + B·(b + c·L)`` seconds for one decode step of B sequences at context L."""

    a: float
    b: float
    c: float
    samples: tuple[tuple[int, int, float], ...] = ()
    max_rel_error: float = 0.0

    def seconds(self, context: int, batch: int = 1) -> float:
        """Predicted seconds of one step (0 for an empty batch)."""
        if context < 0 or batch < 0:
            raise ConfigError("context and batch must not be negative")
        if batch == 0:
            return 0.0
        return self.a + batch * (self.b + self.c * context)


def fit_decode(samples: Sequence[tuple[int, int, float]]) -> DecodeFit:
    """Fit :class:`DecodeFit` to (context, batch, seconds) measurements."""
    _need(samples, 2, "decode fit")
    rows = np.array([[1.0, b, b * ctx] for ctx, b, _ in samples])
    x, worst = nnls_relative(rows, np.array([s for *_, s in samples]))
    kept = tuple((int(c), int(b), float(s)) for c, b, s in samples)
    return DecodeFit(float(x[0]), float(x[1]), float(x[2]), kept, worst)


@dataclass(frozen=True)
class TransferFit:
    """``latency_s + bytes / bandwidth`` seconds to move ``bytes`` raw bytes."""

    latency_s: float
    bandwidth: float
    samples: tuple[tuple[int, float], ...] = ()
    max_rel_error: float = 0.0

    def __post_init__(self) -> None:
        if self.latency_s < 0 or not self.bandwidth > 0:
            raise CalibrationError("a transfer fit needs latency >= 0 and bandwidth > 0")

    def seconds(self, nbytes: float) -> float:
        """Predicted seconds (0 for nothing to move)."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bandwidth


def fit_transfer(samples: Sequence[tuple[int, float]]) -> TransferFit:
    """Fit :class:`TransferFit` to (bytes, seconds) measurements."""
    _need(samples, 2, "transfer fit")
    sizes = np.array([float(b) for b, _ in samples])
    secs = np.array([float(s) for _, s in samples])
    x, worst = nnls_relative(np.column_stack([np.ones_like(sizes), sizes]), secs)
    slope = x[1] if x[1] > 0 else float(np.min(secs / sizes))  # no growth seen: best observed
    kept = tuple((int(b), float(s)) for b, s in samples)
    return TransferFit(float(x[0]), float(1.0 / slope), kept, worst)


@dataclass(frozen=True)
class MeasuredCompute:
    """A ComputeModel fitted to this machine's measured prefill (and decode) times."""

    prefill: PrefillFit
    decode: DecodeFit | None = None

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        """Seconds to prefill ``new`` tokens after ``cached`` ones (from the fit)."""
        return self.prefill.seconds(new, cached)

    def decode_step_seconds(self, context: int, batch: int = 1) -> float:
        """Seconds of one decode step (from the decode fit; else a 1-token prefill per sequence)."""
        if self.decode is not None:
            return self.decode.seconds(context, batch)
        return batch * self.prefill.seconds(1, context)


@dataclass(frozen=True)
class TierFit:
    """One tier's measured load curve (lookup + read into host buffers), and what it was.

    The curve is measured on KV-like chunks through the tier's codec, so it holds the smaller
    read and the decode; ``codec_ratio`` is the raw bytes per stored byte (headers and slot
    rounding included) the tier reached on them, i.e. how many more tokens its capacity holds.
    """

    name: str
    url: str
    load: TransferFit
    notes: tuple[str, ...] = ()
    codec: str = "raw"
    codec_ratio: float = 1.0


@dataclass(frozen=True)
class ProfileModel(KVIdentity):
    """The model a profile was measured with: its KV, bytes per token and chunk size."""

    kv_bytes_per_token: int
    chunk_tokens: int


@dataclass(frozen=True)
class CalibrationProfile:
    """Measured prefill/decode fits, host→device copy and per-tier load fits of one machine.

    ``device_copy`` is the copy from host staging into the tensors the model reads (a PCIe
    copy on CUDA, a memcpy on the CPU); it is one more stage of every tier's path.
    """

    model: ProfileModel
    prefill: PrefillFit
    decode: DecodeFit | None = None
    device_copy: TransferFit | None = None
    tiers: dict[str, TierFit] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    version: int = PROFILE_VERSION

    # --- what the cost model uses ----------------------------------------------------------
    @property
    def compute(self) -> MeasuredCompute:
        """The measured ComputeModel (one forward per prefill)."""
        return self.stepped_compute(0)

    def stepped_compute(self, step: int) -> MeasuredCompute:
        """The measured ComputeModel of an engine whose prefill runs in chunk-aligned forwards
        of ``step`` tokens (exact mode; 0: one forward)."""
        return MeasuredCompute(self.prefill.stepped(step), self.decode)

    def path(self, tier: str) -> TransferPath:
        """The TransferPath of a measured tier: its load fit, then the device copy, in series."""
        fit = self.tiers.get(tier)
        if fit is None:
            known = ", ".join(self.tiers) or "none"
            raise ConfigError(f"no tier {tier!r} in this profile (measured: {known})")
        copy = self.device_copy
        return TransferPath(
            name=fit.name,
            latency_s=fit.load.latency_s + (copy.latency_s if copy else 0.0),
            read_bandwidth=fit.load.bandwidth,
            device_bandwidth=copy.bandwidth if copy else None,
            overlapped=False,  # the engine reads all chunks, then copies them
        )

    def paths(self) -> dict[str, TransferPath]:
        """One TransferPath per measured tier."""
        return {name: self.path(name) for name in self.tiers}

    def cost_model(self) -> CostModel:
        """A CostModel over the measured compute and this model's KV bytes per token."""
        return CostModel(self.compute, self.model.kv_bytes_per_token)

    # --- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""

        def fit(f):
            if f is None:
                return None
            out = {k: getattr(f, k) for k in f.__dataclass_fields__ if k != "samples"}
            out["samples"] = [list(s) for s in f.samples]
            return out

        return {
            "version": self.version,
            "created": self.created,
            "host": dict(self.host),
            "model": dict(self.model.__dict__),
            "prefill": fit(self.prefill),
            "decode": fit(self.decode),
            "device_copy": fit(self.device_copy),
            "tiers": {
                name: {
                    "url": t.url,
                    "notes": list(t.notes),
                    "load": fit(t.load),
                    "codec": t.codec,
                    "codec_ratio": t.codec_ratio,
                }
                for name, t in self.tiers.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationProfile:
        """Rebuild from :meth:`to_dict` output; CalibrationError if it is not a valid profile."""
        try:
            if data.get("version") != PROFILE_VERSION:
                raise CalibrationError(
                    f"profile version {data.get('version')!r}; this kvtier reads "
                    f"{PROFILE_VERSION}: run `kvtier calibrate` again"
                )

            def fit(kind, raw):
                if raw is None:
                    return None
                raw = dict(raw)
                samples = tuple(tuple(s) for s in raw.pop("samples", ()))
                return kind(**raw, samples=samples)

            tiers = {
                name: TierFit(
                    name,
                    str(t["url"]),
                    fit(TransferFit, t["load"]),
                    tuple(t["notes"]),
                    str(t.get("codec", "raw")),
                    float(t.get("codec_ratio", 1.0)),
                )
                for name, t in data.get("tiers", {}).items()
            }
            return cls(
                model=ProfileModel(**data["model"]),
                prefill=fit(PrefillFit, data["prefill"]),
                decode=fit(DecodeFit, data.get("decode")),
                device_copy=fit(TransferFit, data.get("device_copy")),
                tiers=tiers,
                host=dict(data.get("host", {})),
                created=str(data.get("created", "")),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CalibrationError(
                f"not a valid calibration profile ({exc}); run `kvtier calibrate` again"
            ) from None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the profile as JSON (atomically); returns the path."""
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> CalibrationProfile:
        """Read a profile (default: :func:`default_profile_path`)."""
        path = Path(path).expanduser() if path else default_profile_path()
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise CalibrationError(
                f"no calibration profile at {path}; run `kvtier calibrate --out {path}`"
            ) from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CalibrationError(f"cannot read calibration profile {path}: {exc}") from None
        if not isinstance(data, dict):
            raise CalibrationError(f"{path} does not hold a calibration profile object")
        return cls.from_dict(data)
