"""One serving replica: vLLM's continuous-batching scheduler over a paged pool, step by step.

Each step (:meth:`Replica.begin_step`) schedules, as vLLM's V1 scheduler does, the running
requests first (a decode is one token, an unfinished prefill a chunk of the token budget),
preempting the last-admitted running request whenever blocks run out, then — if nobody was
preempted — waiting requests in order (requests whose KV finished loading first), each with
its prefix-cache hit (whole blocks, leaving at least one prompt token to compute) and, with
kvtier, what the connector loads beyond it. A request whose load is asynchronous holds its
blocks and waits; a synchronous load runs inside the step, before its forward. The step's time
comes from the timer; :meth:`Replica.end_step` advances every scheduled request, samples a
token for those whose KV is complete, registers full blocks in the prefix cache, offers
completed chunks to kvtier's tiers and frees finished requests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvtier.sim.config import EngineSpec
from kvtier.sim.connector import Connector
from kvtier.sim.pool import EnginePool
from kvtier.sim.request import SimRequest
from kvtier.sim.timing import StepTimer

ENGINE_TIER = "engine"


@dataclass
class ReplicaStats:
    """Where the replica's time went, and what its scheduler did."""

    compute_s: float = 0.0
    kv_wait_s: float = 0.0
    idle_s: float = 0.0
    steps: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    peak_running: int = 0
    peak_waiting: int = 0
    decisions: dict[str, int] = field(default_factory=dict)


class Replica:
    """An engine with its pool, queues and (optionally) kvtier's connector."""

    def __init__(
        self,
        index: int,
        engine: EngineSpec,
        timer: StepTimer,
        connector: Connector | None = None,
        contention: float = 0.0,
        jitter: float = 0.0,
        seed: tuple[int, ...] = (0,),
    ):
        """``jitter``/``seed``: the log-normal spread of each step's time and the seed of its
        draws (see :class:`~kvtier.sim.config.FrontendSpec`)."""
        self.index = index
        # the frontend's and the connector's (which may be negative) together
        self.contention = contention + (connector.spec.contention if connector else 0.0)
        self.jitter = jitter
        self._rng = np.random.default_rng(list(seed)) if jitter > 0 else None
        self.engine = engine
        self.timer = timer
        self.connector = connector
        self.pool = EnginePool(engine.pool_blocks, engine.block_tokens)
        self.waiting: deque[SimRequest] = deque()
        self.ready: deque[SimRequest] = deque()  # KV loaded, waiting for their compute
        self.running: list[SimRequest] = []
        self.loading: set[SimRequest] = set()
        self.stats = ReplicaStats()
        self.busy = False
        self.idle_since = 0.0
        self.idle_kind = "idle"
        self.outstanding = 0
        self._batch: list[tuple[SimRequest, int]] = []
        self._sync_wait = 0.0

    # --- queue -------------------------------------------------------------------------------
    def add(self, r: SimRequest, now: float, wake: Callable[[float], None]) -> None:
        """A request reached this engine."""
        r.state = "waiting"
        r.arrived_s = now
        r.replica = self.index
        self.outstanding += 1
        self.waiting.append(r)
        self.stats.peak_waiting = max(self.stats.peak_waiting, len(self.waiting))
        if self.connector is not None:
            self.connector.on_new_request(r, now, wake)

    def loaded(self, r: SimRequest, now: float) -> None:
        """An asynchronous load of ``r`` landed: it joins the ready queue."""
        self.loading.discard(r)
        r.load_wait_s += now - (r.load_started_s or now)
        r.state = "waiting"
        self.ready.append(r)

    def _idle_kind(self) -> str:
        return "kv" if self.loading or self._held_back() else "idle"

    def _held_back(self) -> bool:
        return (
            bool(self.waiting)
            and self.connector is not None
            and any(r.preload_pending for r in self.waiting)
        )

    def go_idle(self, now: float) -> None:
        """Nothing to run at ``now``: idle until woken, waiting for KV if a load is under way."""
        self.busy = False
        self.idle_since = now
        self.idle_kind = self._idle_kind()

    def end_idle(self, now: float) -> None:
        """Woken at ``now``: the idle interval goes to its bucket."""
        elapsed = now - self.idle_since
        if elapsed > 0:
            if self.idle_kind == "kv":
                self.stats.kv_wait_s += elapsed
            else:
                self.stats.idle_s += elapsed
        self.idle_since = now

    # --- a step ------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.engine.block_tokens)

    def _preempt(self, victim: SimRequest, now: float) -> None:
        self.running.remove(victim)
        self.pool.release(victim.blocks)
        victim.blocks = []
        victim.computed = 0
        victim.registered = 0
        victim.preemptions += 1
        victim.state = "waiting"
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)

    def _prefill_reserve(self) -> int:
        """Blocks the prefills under way still need for the rest of their prompts: running
        requests still prefilling, and those holding blocks for a load (landed or not)."""
        bt = self.engine.block_tokens
        held = [r for r in self.running if r.computed < r.prompt + r.generated]
        held += list(self.loading) + list(self.ready)
        return sum(max(0, -(-(r.prompt + r.generated) // bt) - len(r.blocks)) for r in held)

    def _victim(self) -> SimRequest:
        if self.engine.scheduling == "priority":
            return max(self.running, key=lambda r: (r.trace.turn, r.due_s))
        return self.running[-1]

    def begin_step(self, now: float, schedule_load: Callable[[SimRequest, float], None]) -> float:
        """Schedule one step at ``now``; its duration (0: nothing could be scheduled)."""
        e = self.engine
        pool = self.pool
        budget = e.max_batched_tokens
        batch: list[tuple[SimRequest, int]] = []
        preempted = False
        i = 0
        running = self.running
        bt = e.block_tokens
        free = pool.free
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.prompt + r.generated - r.computed, budget)
            need = -(-(r.computed + n) // bt) - len(r.blocks)
            scheduled = True
            while need > len(free):
                victim = self._victim()
                self._preempt(victim, now)
                preempted = True
                if victim is r:
                    scheduled = False
                    break
            if not scheduled:
                break
            if need > 0:
                r.blocks += pool.allocate(need) or []
            batch.append((r, n))
            budget -= n
            i += 1

        sync_wait = 0.0
        looked = 0
        if not preempted:
            skipped: list[SimRequest] = []
            while budget > 0 and len(self.running) < e.max_seqs and (self.ready or self.waiting):
                queue = self.ready if self.ready else self.waiting
                r = queue.popleft()
                c = self.connector
                if r.computed == 0 and c is not None and c.holds_back(r, now):
                    skipped.append(r)
                    continue
                hit_keys: list[bytes] = []
                plan = None
                if r.computed == 0:
                    limit = (r.num_tokens - 1) // e.block_tokens
                    if e.prefix_caching:
                        local = pool.lookup(r.keys, limit)
                        hit_keys = r.keys[:local]
                    reload = r.preemptions == 0 or e.preemption == "offload"
                    if c is not None and reload:
                        plan = c.match(r, len(hit_keys) * e.block_tokens, now)
                        looked += 1
                local_tokens = len(hit_keys) * e.block_tokens
                start = r.computed or local_tokens
                ext = plan.tokens if plan else 0
                if plan is not None and not plan.sync:
                    n = 0
                    need = self._blocks_for(start + ext) - len(hit_keys)
                else:
                    n = min(r.num_tokens - start - ext, budget)
                    need = self._blocks_for(start + ext + n) - len(r.blocks) - len(hit_keys)
                reuse = pool.reusable_free(hit_keys)
                keep = int(e.watermark * pool.blocks) if batch else 0
                gate = need
                others = self.running or batch or self.loading or self.ready
                if e.reserve_full_prompt and others:  # alone, it may go on
                    held = len(r.blocks) + len(hit_keys)
                    gate = max(need, -(-r.num_tokens // e.block_tokens) - held)
                    if plan is not None and not plan.sync:
                        keep += self._prefill_reserve()
                if gate + reuse > pool.free_count() - keep:
                    queue.appendleft(r)
                    break
                if r.computed == 0:
                    r.blocks = pool.take_cached(hit_keys) + (pool.allocate(need) or [])
                    r.registered = len(hit_keys)
                    if local_tokens:
                        r.hit_tokens[ENGINE_TIER] = r.hit_tokens.get(ENGINE_TIER, 0) + local_tokens
                elif need > 0:
                    r.blocks += pool.allocate(need) or []
                if r.first_scheduled_s is None:
                    r.first_scheduled_s = now
                if plan is not None and c is not None:
                    end = c.load(r, plan, now)
                    r.computed = start + ext
                    r.stored_chunks = max(r.stored_chunks, r.computed // c.chunk)
                    if not plan.sync:
                        r.state = "loading"
                        r.load_started_s = now
                        self.loading.add(r)
                        schedule_load(r, end)
                        continue
                    wait = max(0.0, end - now)
                    sync_wait = max(sync_wait, wait)
                    r.load_wait_s += wait
                else:
                    r.computed = start
                    if c is not None:
                        r.stored_chunks = max(r.stored_chunks, r.computed // c.chunk)
                r.state = "running"
                self.running.append(r)
                batch.append((r, n))
                budget -= n
            for r in reversed(skipped):
                self.waiting.appendleft(r)

        self._batch = batch
        self._sync_wait = sync_wait
        if not batch:
            return 0.0
        prefill = []
        decodes = []
        for r, n in batch:
            if n == 1 and r.computed >= r.prompt:
                decodes.append(r.computed)
            elif n > 0:
                prefill.append((n, r.computed))
        compute = self.timer.step_seconds(prefill, decodes)
        if self.connector is not None:
            kv = self.connector.spec
            compute += kv.token_cost_s * sum(n for n, _ in prefill) + kv.request_cost_s * looked
        if self.contention > 0 and self.outstanding > 1:
            compute *= 1.0 + self.contention * (self.outstanding - 1)
        if self._rng is not None:
            compute *= math.exp(self.jitter * float(self._rng.standard_normal()))
        st = self.stats
        st.steps += 1
        st.compute_s += compute
        st.kv_wait_s += sync_wait
        st.peak_running = max(st.peak_running, len(self.running))
        return sync_wait + compute

    def end_step(self, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """The step scheduled last ended at ``now``: advance its requests; (those that sampled a
        token, those that finished)."""
        finished: list[SimRequest] = []
        sampled: list[SimRequest] = []
        bt = self.engine.block_tokens
        st = self.stats
        connector = self.connector
        chunk = connector.chunk if connector is not None else 1
        for r, n in self._batch:
            if r.state != "running":
                continue
            before = r.computed
            r.computed += n
            if r.computed > r.prompt and before >= r.prompt:
                st.decode_tokens += n
            else:
                st.prefill_tokens += n
                r.computed_tokens += n
                if before < r.most_computed:
                    r.recomputed_tokens += min(r.computed, r.most_computed) - before
            if r.computed > r.most_computed:
                r.most_computed = r.computed
            full = r.computed // bt
            if full > r.registered:
                for j in range(r.registered, full):
                    self.pool.register(r.blocks[j], r.key(j))
                r.registered = full
            if connector is not None and r.computed // chunk > r.stored_chunks:
                connector.store_completed(r, now)
            if r.computed >= r.prompt + r.generated:
                r.generated += 1
                sampled.append(r)
                if r.first_token_s is None:
                    r.first_token_s = now
                if r.generated >= r.output:
                    r.finish_s = now
                    r.state = "done"
                    self.running.remove(r)
                    self.pool.release(r.blocks)
                    r.blocks = []
                    self.outstanding -= 1
                    finished.append(r)
        self._batch = []
        return sampled, finished


__all__ = ["ENGINE_TIER", "Replica", "ReplicaStats"]
