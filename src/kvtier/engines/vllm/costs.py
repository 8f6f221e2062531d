"""The connector's load-or-recompute costs, learnt from what the engine measures while it serves.

The worker side times every step's forward (with the tokens it prefilled after how many cached)
and every load (bytes and seconds, per tier) and sends them to the scheduler side, which fits
the prefill curve (:func:`~kvtier.cost.online.robust_prefill_fit`) and each tier's read speed,
and decides with the same :class:`~kvtier.policy.decision.LoadOrRecompute` as every kvtier
engine. Chunks vLLM's own prefix cache holds enter as the tier ``engine``, which costs nothing
to "load". Until the prefill curve and a tier's speed have been measured (``MIN_LOADS`` loads),
every hit is loaded: a cold cache has nothing better to go on, and the first loads are what
measure the tier. A tier's speed is the median of its recent loads' rates, so one slow load (a
cold page cache, a noisy neighbour) does not condemn it; and a tier the decision keeps passing
over is loaded again once every ``EXPLORE_EVERY`` such decisions, so an estimate that went bad
is measured again instead of holding for good.

The prefill curve is fitted when a decision asks for it, and refitted at most once every
``REFIT_S`` as samples arrive: a robust fit drops outliers one at a time, which on noisy
samples costs far more than a step can spare, and the samples arrive in vLLM's step loop,
where every millisecond is the engine's. A workload whose prompts never hit kvtier then never
fits at all.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvtier.cost.calibration import CalibrationError, PrefillFit
from kvtier.cost.online import robust_prefill_fit
from kvtier.policy.decision import Decision, LoadOrRecompute

ENGINE = "engine"
#: Fewest prefill samples (at distinct lengths) the curve is fitted from.
MIN_PREFILLS = 4
#: Samples kept per kind (the most recent ones).
KEEP = 256
#: Loads a tier needs before its measured speed may argue against loading from it.
MIN_LOADS = 3
#: A tier passed over this many times in a row is loaded once more, to measure it again.
EXPLORE_EVERY = 16
#: Seconds between refits of the prefill curve while samples keep arriving.
REFIT_S = 1.0


@dataclass(frozen=True)
class MeasuredPath:
    """Seconds to read bytes from one tier: a fixed cost per load plus bytes over bandwidth."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, raw_bytes: float) -> float:
        """Predicted seconds to read ``raw_bytes``."""
        return self.latency_s + raw_bytes / self.bytes_per_s


class _Free:
    """The path of chunks already in the engine's memory."""

    def seconds(self, raw_bytes: float) -> float:
        return 0.0


class _Compute:
    def __init__(self, fit: PrefillFit):
        self.fit = fit

    def prefill_seconds(self, new: int, cached: int = 0) -> float:
        return self.fit.seconds(new, cached)


class OnlineCosts:
    """Prefill and per-tier load measurements, and the decision they support (thread-safe)."""

    def __init__(
        self,
        tier_names: Sequence[str],
        chunk_tokens: int,
        chunk_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.tier_names = tuple(tier_names)
        self.chunk_tokens = chunk_tokens
        self.chunk_bytes = chunk_bytes
        self._prefills: list[tuple[int, int, float]] = []
        self._loads: dict[str, list[tuple[int, float, int]]] = {n: [] for n in tier_names}
        self._fit: PrefillFit | None = None
        self._stale = False  # samples arrived since the last fit
        self._fitted_at = -float("inf")
        self._clock = clock
        self._paths: dict[str, MeasuredPath] = {}
        self._passed: dict[str, int] = {n: 0 for n in tier_names}
        self._lock = threading.Lock()

    # --- measurements ----------------------------------------------------------------------
    def observe_prefill(self, new: int, cached: int, seconds: float) -> None:
        """One forward that prefilled ``new`` tokens after ``cached`` ones in ``seconds``."""
        if new <= 1 or seconds <= 0:
            return
        with self._lock:
            self._prefills.append((int(new), int(cached), float(seconds)))
            del self._prefills[:-KEEP]
            self._stale = True

    def _current_fit(self) -> PrefillFit | None:
        """(Lock held.) The prefill curve, refitted first when samples arrived since the last
        fit and ``REFIT_S`` has passed (or there is no fit yet)."""
        if not self._stale:
            return self._fit
        now = self._clock()
        if self._fit is not None and now - self._fitted_at < REFIT_S:
            return self._fit
        self._stale = False
        if len({n for n, _, _ in self._prefills}) >= MIN_PREFILLS:
            with contextlib.suppress(CalibrationError):
                self._fit = robust_prefill_fit(self._prefills)
                self._fitted_at = now
        return self._fit

    def observe_load(self, tier: str, nbytes: int, seconds: float, chunks: int) -> None:
        """One load of ``chunks`` chunks (``nbytes``) from ``tier`` that took ``seconds``."""
        if tier not in self._loads or nbytes <= 0 or seconds <= 0:
            return
        with self._lock:
            samples = self._loads[tier]
            samples.append((int(nbytes), float(seconds), int(chunks)))
            del samples[:-KEEP]
            rates = sorted(b / s for b, s, _ in samples)
            self._passed[tier] = 0
            if len(samples) >= MIN_LOADS:
                self._paths[tier] = MeasuredPath(0.0, rates[len(rates) // 2])

    # --- what they say -----------------------------------------------------------------------
    @property
    def measured(self) -> bool:
        """Whether the prefill curve has been fitted."""
        with self._lock:
            return self._current_fit() is not None

    @property
    def prefill_samples(self) -> int:
        """Prefill samples kept (without fitting anything)."""
        with self._lock:
            return len(self._prefills)

    def path(self, tier: str) -> MeasuredPath | None:
        """The measured read path of ``tier`` (None before its first load)."""
        return self._paths.get(tier)

    def prefill_seconds(self, new: int, cached: int = 0) -> float | None:
        """Predicted prefill seconds (None before the curve is fitted)."""
        with self._lock:
            fit = self._current_fit()
        return None if fit is None else fit.seconds(new, cached)

    def decide(
        self,
        prompt_tokens: int,
        local_chunks: int,
        hit_tiers: Sequence[str],
        queued_bytes: Mapping[str, float] | None = None,
    ) -> tuple[int, Decision | None]:
        """How many leading chunks to have (vLLM's ``local_chunks`` plus loaded ones).

        ``hit_tiers`` names the tier of each chunk kvtier holds after the local ones;
        ``queued_bytes`` are bytes of loads already in flight per tier (they delay this one).
        Returns the chunk count and the decision (None while unmeasured: load every hit).
        """
        with self._lock:
            fit = self._current_fit()
            paths: dict[str, object] = dict(self._paths)
            used = set(hit_tiers)
            stale = [t for t in used if self._passed.get(t, 0) >= EXPLORE_EVERY]
            for t in stale:
                self._passed[t] = 0
        everything = local_chunks + len(hit_tiers)
        if fit is None or stale or any(t not in paths for t in used):
            return everything, None
        paths[ENGINE] = _Free()
        bandwidth = {t: p for t, p in paths.items() if isinstance(p, MeasuredPath)}
        queued = queued_bytes or {}
        queued_s = {t: b / bandwidth[t].bytes_per_s for t, b in queued.items() if t in bandwidth}
        policy = LoadOrRecompute(
            _Compute(fit), self.chunk_bytes / self.chunk_tokens, paths, self.chunk_tokens
        )
        # every full chunk the scheduler offers is usable: a load of the whole request goes
        # asynchronously, and vLLM recomputes its last token after it
        decision = policy.decide(
            prompt_tokens,
            [ENGINE] * local_chunks + list(hit_tiers),
            queued_s,
            usable=everything,
        )
        want = max(decision.load_chunks, local_chunks)
        with self._lock:
            for t in set(hit_tiers[want - local_chunks :]):
                if t in self._passed:
                    self._passed[t] += 1
        return want, decision

    def as_dict(self) -> dict:
        """What has been measured (JSON-ready; the fit as of the last decision)."""
        with self._lock:
            return {
                "prefill_samples": len(self._prefills),
                "prefill_fitted": self._fit is not None,
                "tier_bytes_per_s": {t: p.bytes_per_s for t, p in self._paths.items()},
            }


__all__ = ["ENGINE", "MeasuredPath", "OnlineCosts"]
