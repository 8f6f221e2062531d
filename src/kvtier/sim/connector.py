"""kvtier's vLLM connector, simulated: lookups beyond the engine's prefix cache, the
load-or-recompute cut, synchronous or asynchronous loads, write-through stores and preloading.

It does what ``engines.vllm`` does, on :class:`~kvtier.sim.tiers.SimTier` books: a request's
chunks are looked up in the tiers (fast→slow) from the first chunk the engine's own cache does
not hold; the real :class:`~kvtier.policy.decision.LoadOrRecompute` chooses how many to load,
given each tier's queued transfers; chunks all in the first tier load inside the step, others
while the engine runs other requests. Every chunk a step completes that ``admit`` keeps (the
connector's :class:`~kvtier.policy.store_admission.StoreAdmission` over each request's prompt) is
offered to every tier (each tier's admission and eviction decide), and a chunk read from a
slower tier is promoted into the faster ones. A queued request's chunks on slower tiers are
copied into the first tier ahead of its turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.policy.decision import LoadOrRecompute
from kvtier.policy.store_admission import StoreAdmission
from kvtier.sim.config import EngineSpec, KvtierSpec
from kvtier.sim.links import LinkQueue
from kvtier.sim.request import SimRequest
from kvtier.sim.tiers import SimTier
from kvtier.sim.timing import StepTimer

Schedule = Callable[[float, Callable[[float], None]], None]


@dataclass(frozen=True)
class LoadPlan:
    """Chunks ``first … first + count - 1`` load from ``tiers`` (one name per chunk); the
    request then holds ``tokens`` more tokens of KV; ``sync``: inside the scheduling step."""

    first: int
    count: int
    tiers: tuple[str, ...]
    tokens: int
    sync: bool
    action: str


class Connector:
    """One replica's connector over its tiers (the shared ones are shared objects)."""

    def __init__(
        self,
        spec: KvtierSpec,
        engine: EngineSpec,
        tiers: list[SimTier],
        timer: StepTimer,
        schedule: Schedule,
        host_in: LinkQueue | None,
        host_out: LinkQueue | None,
    ):
        self.spec = spec
        self.tiers = tiers
        self.by_name = {t.name: t for t in tiers}
        self.timer = timer
        self.schedule = schedule
        self.host_in = host_in
        self.host_out = host_out
        self.chunk = spec.chunk_tokens
        self.per_chunk = spec.chunk_tokens // engine.block_tokens
        self.chunk_bytes = spec.chunk_tokens * engine.kv_bytes_per_token
        host_bw = spec.host_link_bandwidth
        self.decision = LoadOrRecompute(
            timer,
            engine.kv_bytes_per_token / tiers[0].spec.sharers,
            {t.name: t.path(host_bw, spec.host_link_latency_s) for t in tiers},
            spec.chunk_tokens,
        )
        self.preload_queue: deque[tuple[SimRequest, list[tuple[bytes, SimTier]]]] = deque()
        self.preload_in_flight = 0.0
        self.decisions: dict[str, int] = {}
        self.preloaded_chunks = 0
        self.stored_chunks = 0
        self.unadmitted_chunks = 0
        self.promoted_chunks = 0
        self.admission = StoreAdmission(spec.admit)

    # --- lookups and loads -------------------------------------------------------------------
    def chunk_key(self, r: SimRequest, c: int) -> bytes:
        """The key of chunk ``c`` of ``r``: the key of its last engine block."""
        return r.key((c + 1) * self.per_chunk - 1)

    def tier_of(self, key: bytes, now: float) -> SimTier | None:
        """The fastest tier whose copy of ``key`` a read now finds."""
        for tier in self.tiers:
            if tier.holds(key, now):
                return tier
        return None

    def found(self, r: SimRequest, first: int, now: float) -> list[str]:
        """The tier of each leading chunk of ``r`` from chunk ``first`` that a read now finds
        (up to the first miss, leaving at least one prompt token to compute)."""
        usable_end = (r.num_tokens - 1) // self.chunk
        names: list[str] = []
        for c in range(first, usable_end):
            tier = self.tier_of(self.chunk_key(r, c), now)
            if tier is None:
                break
            names.append(tier.name)
        return names

    def estimate(
        self,
        r: SimRequest,
        local_tokens: int,
        now: float,
        memo: dict[tuple, float] | None = None,
    ) -> float:
        """Predicted seconds until ``r``'s prompt KV is complete on this replica, beyond the
        engine's own ``local_tokens``: what :meth:`match` would load (waiting behind the tiers'
        queued transfers) plus the prefill of the rest, as the load-or-recompute decision
        predicts it (every hit loaded when it is off). Books nothing. ``memo``: predictions
        already made for the same prompt, hits and queues (replicas that find the same)."""
        first = local_tokens // self.chunk
        names = self.found(r, first, now)
        prompt = r.num_tokens - first * self.chunk
        queued = {name: self.by_name[name].medium.backlog_s(now) for name in sorted(set(names))}
        key = (prompt, tuple(names), tuple(queued.items()))
        if memo is not None and key in memo:
            return memo[key]
        if self.spec.decide:
            seconds = self.decision.decide(prompt, names, queued, usable=len(names)).predicted_s
        else:
            cached = len(names) * self.chunk
            seconds = self.decision.load_seconds(names, queued) + self.timer.prefill_seconds(
                max(prompt - cached, 1), cached
            )
        if memo is not None:
            memo[key] = seconds
        return seconds

    def match(self, r: SimRequest, local_tokens: int, now: float) -> LoadPlan | None:
        """What to load for ``r`` beyond the engine's own ``local_tokens`` (None: nothing)."""
        first = local_tokens // self.chunk
        names = self.found(r, first, now)
        if not names:
            return None
        count, action = len(names), "load"
        if self.spec.decide:
            queued = {t.name: t.medium.backlog_s(now) for t in self.tiers}
            d = self.decision.decide(
                r.num_tokens - first * self.chunk, names, queued, usable=len(names)
            )
            count, action = d.load_chunks, d.action
        self.decisions[action] = self.decisions.get(action, 0) + 1
        r.decision = action
        tokens = (first + count) * self.chunk - local_tokens
        if count == 0 or tokens <= 0:
            return None
        chosen = tuple(names[:count])
        sync = self.spec.sync_first and all(n == self.tiers[0].name for n in chosen)
        return LoadPlan(first, count, chosen, tokens, sync, action)

    def load(self, r: SimRequest, plan: LoadPlan, now: float) -> float:
        """Book the plan's reads (tiers in parallel, each on its own queue); when they land."""
        groups: dict[str, list[bytes]] = {}
        for i, name in enumerate(plan.tiers):
            groups.setdefault(name, []).append(self.chunk_key(r, plan.first + i))
        end = now
        for name, keys in groups.items():
            tier = self.by_name[name]
            transfer = tier.read(keys, len(keys) * self.chunk_bytes, now, self.host_in)
            end = max(end, transfer.end)
            r.hit_tokens[name] = r.hit_tokens.get(name, 0) + len(keys) * self.chunk
            self._promote(tier, keys, transfer.end)
        return end

    def _promote(self, source: SimTier, keys: list[bytes], now: float) -> None:
        for tier in self.tiers:
            if tier is source:
                return
            for key in keys:
                if tier.offer(key, self.chunk_bytes, now, None) is not None:
                    self.promoted_chunks += 1

    # --- stores ------------------------------------------------------------------------------
    def store_completed(self, r: SimRequest, now: float) -> None:
        """Offer every chunk ``r`` completed since the last call to every tier."""
        if not self.spec.store:
            return
        done = r.computed // self.chunk
        chosen = self.admission.admitted(range(r.stored_chunks, done), r.repeats)
        self.unadmitted_chunks += max(0, done - r.stored_chunks) - len(chosen)
        for c in chosen:
            key = self.chunk_key(r, c)
            value = self.timer.step_seconds(((self.chunk, c * self.chunk),), ())
            host = self.host_out
            for tier in self.tiers:
                if tier.offer(key, self.chunk_bytes, now, host, value) is not None:
                    host = None  # the chunk crossed the host link once
                    self.stored_chunks += 1
        r.stored_chunks = max(r.stored_chunks, done)

    # --- preloading --------------------------------------------------------------------------
    def on_new_request(self, r: SimRequest, now: float, wake: Callable[[float], None]) -> None:
        """``r`` was queued: book its prompt's chunks; copy those on slower tiers into the
        first tier."""
        if self.admission.books and r.repeats is None:
            prompt = [self.chunk_key(r, c) for c in range(r.num_tokens // self.chunk)]
            r.repeats = self.admission.sight(prompt)
        if not self.spec.preload or len(self.tiers) < 2:
            return
        first = self.tiers[0]
        todo: list[tuple[bytes, SimTier]] = []
        for c in range((r.num_tokens - 1) // self.chunk):
            key = self.chunk_key(r, c)
            if first.holds(key, now):
                continue
            tier = self.tier_of(key, now)
            if tier is None:
                break
            todo.append((key, tier))
        if not todo:
            return
        self.preload_queue.append((r, todo))
        self._pump(now, wake)
        self.schedule(r.arrived_s + self.spec.preload_wait_s, wake)  # the hold ends: look again

    def _pump(self, now: float, wake: Callable[[float], None]) -> None:
        first = self.tiers[0]
        while self.preload_queue and self.preload_in_flight < self.spec.preload_bytes:
            r, todo = self.preload_queue[0]
            if r.state != "waiting":
                self.preload_queue.popleft()  # scheduled meanwhile: it loads from where it is
                continue
            key, tier = todo.pop(0)
            if not todo:
                self.preload_queue.popleft()
            transfer = tier.read([key], self.chunk_bytes, now, None)
            self.preload_in_flight += self.chunk_bytes
            r.preload_pending += 1
            landed = first.offer(key, self.chunk_bytes, transfer.end, None) or transfer.end

            def done(t: float, r: SimRequest = r) -> None:
                self.preload_in_flight -= self.chunk_bytes
                self.preloaded_chunks += 1
                r.preload_pending = max(0, r.preload_pending - 1)
                self._pump(t, wake)
                wake(t)

            self.schedule(landed, done)

    def holds_back(self, r: SimRequest, now: float) -> bool:
        """Whether ``r``'s turn waits for its preload (copies under way, within the wait)."""
        return r.preload_pending > 0 and now < r.arrived_s + self.spec.preload_wait_s


__all__ = ["Connector", "LoadPlan"]
