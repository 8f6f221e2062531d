"""A prefill model that keeps learning: the profile's samples plus every prefill the engine runs.

On a machine shared with other work a short calibration can catch a burst of contention and
mis-measure a point several times over. :class:`RefinedCompute` starts from the profile's
samples, fits them robustly (the worst point is dropped while it is off by more than
``outlier`` and enough points remain), and adds each prefill the kvtier engine then measures
(``observe``): what a deployed engine sees anyway, misses as full prefills and loads as
prefills after a cached prefix. A decision only ever uses what was measured before it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

from kvtier.cost.calibration import (
    CalibrationError,
    DecodeFit,
    MeasuredCompute,
    PrefillFit,
    fit_prefill,
)

#: A sample whose fitted time is off by more than this fraction counts as disturbed (quiet-machine
#: repeats differ by 5-10 %; contention bursts slow a point 2-5x).
OUTLIER = 0.2


def robust_prefill_fit(
    samples: Sequence[tuple[int, int, float]], outlier: float = OUTLIER
) -> PrefillFit:
    """Fit the prefill curve, dropping the worst sample while it is off by more than ``outlier``.

    Context terms are fitted when the samples hold at least two cached lengths; at most a
    quarter of the samples are dropped, and never below five.
    """
    kept = list(samples)
    budget = len(kept) // 4
    while True:
        cached = {p for _, p, _ in kept if p > 0}
        context = len(cached) >= 2 and len(kept) >= 5
        fit = fit_prefill(kept, context_terms=context)
        if budget <= 0 or len(kept) <= 5 or fit.max_rel_error <= outlier:
            return fit
        worst = max(kept, key=lambda s: abs(fit.seconds(s[0], s[1]) - s[2]) / s[2])
        kept.remove(worst)
        budget -= 1


class RefinedCompute:
    """A ComputeModel over the profile's prefill samples and the run's own measured prefills.

    Samples are single forwards; ``step`` > 0 predicts an engine that prefills in chunk-aligned
    forwards of ``step`` tokens (exact mode) as their sum (:meth:`PrefillFit.stepped`).
    """

    def __init__(self, prefill: PrefillFit, decode: DecodeFit | None = None, step: int = 0):
        self.decode = decode
        self.step = int(step)
        self._base = list(prefill.samples)
        self._seen: list[tuple[int, int, float]] = []
        self._lock = threading.Lock()
        try:
            fit = robust_prefill_fit(self._base) if len(self._base) >= 3 else prefill
        except CalibrationError:
            fit = prefill
        self._model = MeasuredCompute(fit.stepped(self.step), decode)

    @property
    def fit(self) -> PrefillFit:
        """The current fit."""
        return self._model.prefill

    @property
    def observed(self) -> int:
        """Prefills observed so far."""
        return len(self._seen)

    def observe(self, new: int, cached: int, seconds: float) -> None:
        """Add one measured prefill (``new`` tokens after ``cached``) and refit."""
        if new <= 0 or seconds <= 0:
            return
        with self._lock:
            self._seen.append((int(new), int(cached), float(seconds)))
            with contextlib.suppress(CalibrationError):  # keep the last good fit
                fit = robust_prefill_fit([*self._base, *self._seen]).stepped(self.step)
                self._model = MeasuredCompute(fit, self.decode)

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        """Seconds to prefill ``new`` tokens after ``cached`` ones (current fit)."""
        return self._model.prefill_seconds(new, cached)

    def decode_step_seconds(self, context: int, batch: int = 1) -> float:
        """Seconds of one decode step (as :class:`MeasuredCompute` with the current fit)."""
        return self._model.decode_step_seconds(context, batch)
