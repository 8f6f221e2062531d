"""The one comparison kvtier is built on: seconds to recompute a prefix vs seconds to reload it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvtier.cost.compute import ComputeModel
from kvtier.cost.transfer import TransferPath
from kvtier.errors import ConfigError

#: Longest prefix the break-even search considers unless told otherwise (1 Mi tokens).
DEFAULT_MAX_TOKENS = 1 << 20


@dataclass(frozen=True)
class Comparison:
    """Recompute vs reload of one prefix length on one path; ``ratio`` > 1 means reload wins."""

    tokens: int
    recompute_s: float
    reload_s: float
    ratio: float


class CostModel:
    """Recompute and reload seconds for prefixes of a model whose KV costs ``kv_bytes_per_token``.

    Reloading a prefix of P tokens replaces exactly prefill(P, cached=0): the tokens that follow
    cost the same either way, because causal attention over the prefix is paid by them in both.
    """

    def __init__(self, compute: ComputeModel, kv_bytes_per_token: float):
        if kv_bytes_per_token <= 0:
            raise ConfigError(f"kv_bytes_per_token must be positive, got {kv_bytes_per_token}")
        self.compute = compute
        self.kv_bytes_per_token = float(kv_bytes_per_token)

    def recompute_seconds(self, tokens: int, cached: int = 0) -> float:
        """Seconds to prefill ``tokens`` new tokens after ``cached`` ones."""
        return self.compute.prefill_seconds(tokens, cached)

    def reload_seconds(self, path: TransferPath, tokens: int) -> float:
        """Seconds to bring the KV of ``tokens`` tokens back over ``path``."""
        if tokens < 0:
            raise ConfigError(f"tokens must not be negative, got {tokens}")
        return path.seconds(tokens * self.kv_bytes_per_token)

    def ratio(self, path: TransferPath, tokens: int) -> float:
        """Recompute seconds / reload seconds for a prefix of ``tokens`` (> 1: reload wins)."""
        reload = self.reload_seconds(path, tokens)
        recompute = self.recompute_seconds(tokens)
        if reload == 0:
            return float("inf") if recompute > 0 else 1.0
        return recompute / reload

    def compare(self, path: TransferPath, lengths: Iterable[int]) -> list[Comparison]:
        """Recompute vs reload at each prefix length."""
        out = []
        for n in lengths:
            recompute = self.recompute_seconds(n)
            reload = self.reload_seconds(path, n)
            ratio = recompute / reload if reload else (float("inf") if recompute else 1.0)
            out.append(Comparison(n, recompute, reload, ratio))
        return out

    def ttft_seconds(
        self,
        prompt_tokens: int,
        cached_tokens: int = 0,
        path: TransferPath | None = None,
    ) -> float:
        """Seconds to the first token of one request, with nothing queued ahead of it.

        The request's first ``cached_tokens`` are held behind ``path`` (None: already in the
        GPU's own cache, no wait). It waits for their reload, or recomputes them where reloading
        loses (:meth:`reload_wins`); then prefills the other prompt tokens after them, whose last
        forward samples the first token (as vLLM does). At least one prompt token is computed,
        since the model must produce logits.
        """
        if prompt_tokens < 1:
            raise ConfigError(f"a prompt has at least one token, got {prompt_tokens}")
        if not 0 <= cached_tokens < prompt_tokens:
            raise ConfigError(
                f"cached tokens must be in [0, {prompt_tokens - 1}] for a prompt of "
                f"{prompt_tokens}, got {cached_tokens}"
            )
        if cached_tokens and path is not None:
            if self.reload_wins(path, cached_tokens):
                wait = self.reload_seconds(path, cached_tokens)
            else:
                wait = self.recompute_seconds(cached_tokens)
        else:
            wait = 0.0
        new = prompt_tokens - cached_tokens
        prefill = self.recompute_seconds(new, cached_tokens)
        return wait + prefill

    def reload_wins(self, path: TransferPath, tokens: int) -> bool:
        """True when reloading ``tokens`` of prefix is strictly faster than recomputing them."""
        return self.reload_seconds(path, tokens) < self.recompute_seconds(tokens)

    def break_even_tokens(
        self, path: TransferPath, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> int | None:
        """Smallest prefix length (1 … ``max_tokens``) whose reload beats its recompute, or None.

        Recompute grows at least linearly and convexly in the prefix length while reload is
        affine, so once reload wins it keeps winning; a binary search finds the crossing.
        """
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}")
        if not self.reload_wins(path, max_tokens):
            return None
        lo, hi = 0, max_tokens  # reload loses at lo (or lo == 0), wins at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.reload_wins(path, mid):
                hi = mid
            else:
                lo = mid
        return hi
