"""The event loop: a client sends the workload's requests, replicas step, loads land.

Events sit in one heap ordered by (time, sequence number), so equal times resolve in the order
they were booked and a run is the same for the same inputs. The client sends a request when it
is due — at its arrival time, or (closed loop, for traces that record it) ``after_s`` after
its session's previous answer — and while fewer than ``concurrency`` are in flight; it reaches
a replica ``request_overhead_s`` later. A :class:`~kvtier.sim.routing.Router` picks the
replica when the request is sent.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence

from kvtier.errors import ConfigError
from kvtier.sim.config import SimConfig
from kvtier.sim.connector import Connector
from kvtier.sim.links import LinkQueue
from kvtier.sim.replica import Replica
from kvtier.sim.request import SimRequest, engine_keys
from kvtier.sim.results import SimResult, build_result
from kvtier.sim.routing import Router
from kvtier.sim.tiers import SimTier
from kvtier.workloads.requests import TraceRequest

Progress = Callable[[int, int], None]


class Simulator:
    """One simulation of ``requests`` under ``config``; :meth:`run` returns its result."""

    def __init__(self, config: SimConfig, requests: Sequence[TraceRequest]):
        if not requests:
            raise ConfigError("the workload has no requests")
        self.config = config
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        engine = config.engine
        self.requests = [
            SimRequest(
                rid=i,
                trace=t,
                keys=engine_keys(t, engine.block_tokens),
                due_s=t.arrival_s,
                output=max(1, t.output_tokens),
            )
            for i, t in enumerate(requests)
        ]
        self.links: dict[str, LinkQueue] = {}
        self.tiers: list[list[SimTier]] = []
        self.replicas = [self._replica(i) for i in range(config.replicas)]
        self.router = Router(config.routing, self.replicas, engine, config.timer)
        self._pending: deque[SimRequest] = deque()
        self._in_flight = 0
        self._done = 0
        self._sessions: dict[str, deque[SimRequest]] = {}
        self._front_free = [0.0] * config.replicas

    # --- building ----------------------------------------------------------------------------
    def _link(self, name: str, bandwidth: float, latency: float = 0.0) -> LinkQueue:
        link = self.links.get(name)
        if link is None:
            link = self.links[name] = LinkQueue(name, bandwidth, latency)
        return link

    def _replica(self, i: int) -> Replica:
        cfg = self.config
        connector = None
        kv = cfg.kvtier
        if kv is not None:
            tiers: list[SimTier] = []
            shared_tiers = {t.name: t for row in self.tiers for t in row if t.spec.shared}
            for spec in kv.tiers:
                if spec.shared and spec.name in shared_tiers:
                    tiers.append(shared_tiers[spec.name])
                    continue
                where = spec.name if spec.shared else f"{spec.name}[{i}]"
                medium = self._link(where, spec.read_bandwidth, spec.latency_s)
                network = (
                    self._link("network", cfg.network_bandwidth, cfg.network_latency_s)
                    if spec.shared
                    else None
                )
                decoder = (
                    self._link(f"decode[{i}]", spec.decode_bandwidth)
                    if spec.decode_bandwidth
                    else None
                )
                tiers.append(SimTier(spec, medium, network=network, decoder=decoder))
            self.tiers.append(tiers)
            host_in = host_out = None
            if kv.host_link_bandwidth:
                bw, lat = kv.host_link_bandwidth, kv.host_link_latency_s
                host_in = self._link(f"host->engine[{i}]", bw, lat)
                host_out = self._link(f"engine->host[{i}]", bw, lat)
            connector = Connector(kv, cfg.engine, tiers, cfg.timer, self._at, host_in, host_out)
        front = cfg.frontend
        contention = front.contention if front is not None else 0.0
        jitter = front.jitter if front is not None else 0.0
        return Replica(
            i, cfg.engine, cfg.timer, connector, contention, jitter=jitter, seed=(cfg.seed, i)
        )

    # --- events ------------------------------------------------------------------------------
    def _at(self, t: float, fn: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn))

    def _due(self, r: SimRequest) -> Callable[[float], None]:
        def fire(t: float) -> None:
            r.due_s = t
            self._pending.append(r)
            self._send(t)

        return fire

    def _front(self, replica: Replica, now: float, work: float) -> float:
        """Book ``work`` seconds on the replica's frontend from ``now``; when it is done."""
        spec = self.config.frontend
        if spec is None or work <= 0:
            return now
        start = max(now, self._front_free[replica.index])
        speed = spec.share if replica.busy else 1.0
        end = start + work / speed
        self._front_free[replica.index] = end
        return end

    def _send(self, now: float) -> None:
        limit = self.config.concurrency
        overhead = self.config.timer.request_overhead_s
        front = self.config.frontend
        while self._pending and (limit is None or self._in_flight < limit):
            r = self._pending.popleft()
            r.sent_s = now
            self._in_flight += 1
            replica = self.router.route(r, now)
            at = now + overhead
            if front is not None:
                at = self._front(replica, at, front.in_s)
            self._at(at, lambda t, r=r, rep=replica: self._arrive(rep, r, t))

    def _arrive(self, replica: Replica, r: SimRequest, now: float) -> None:
        self.router.arrived(replica, r)
        e = self.config.engine
        longest = r.prompt + r.output
        if (e.max_model_len and longest > e.max_model_len) or (
            -(-longest // e.block_tokens) > e.pool_blocks
        ):  # the engine refuses what it could never hold, as vLLM does
            r.state = "rejected"
            r.arrived_s = now
            self._finished(r, now)
            return
        replica.add(r, now, lambda t, rep=replica: self._kick(rep, t))
        self._kick(replica, now)

    def _kick(self, replica: Replica, now: float) -> None:
        if replica.busy:
            return
        replica.end_idle(now)
        duration = replica.begin_step(now, lambda r, t, rep=replica: self._load_at(rep, r, t))
        if duration <= 0 and not replica._batch:
            replica.go_idle(now)
            return
        replica.busy = True
        self._at(now + duration, lambda t, rep=replica: self._step_done(rep, t))

    def _load_at(self, replica: Replica, r: SimRequest, t: float) -> None:
        def landed(now: float) -> None:
            replica.loaded(r, now)
            self._kick(replica, now)

        self._at(t, landed)

    def _step_done(self, replica: Replica, now: float) -> None:
        sampled, finished = replica.end_step(now)
        replica.busy = False
        replica.idle_since = now
        front = self.config.frontend
        if front is None:
            for r in finished:
                self._finished(r, now)
            self._kick(replica, now)
            return
        self._kick(replica, now)  # the engine goes on while the frontend delivers
        done = set(finished)
        for r in sampled:
            delivered = self._front(replica, now, front.out_s)
            if r.generated == 1:
                r.first_token_s = delivered
            if r in done:
                r.finish_s = delivered
                self._at(delivered, lambda t, r=r: self._finished(r, t))

    def _finished(self, r: SimRequest, now: float) -> None:
        self._in_flight -= 1
        self._done += 1
        session = r.trace.session
        if session is not None and self.config.closed_loop:
            queue = self._sessions.get(session)
            if queue:
                nxt = queue.popleft()
                wait = nxt.trace.after_s
                when = now + wait if wait is not None else max(now, nxt.trace.arrival_s)
                self._at(when, self._due(nxt))
        self._send(now)

    # --- running -----------------------------------------------------------------------------
    def run(self, progress: Progress | None = None) -> SimResult:
        """Play the whole workload; the per-request records and the summary."""
        closed = self.config.closed_loop
        for r in self.requests:
            session = r.trace.session
            if closed and session is not None:
                if session in self._sessions:  # a later turn: due after the previous answer
                    self._sessions[session].append(r)
                    continue
                self._sessions[session] = deque()
            self._at(r.trace.arrival_s, self._due(r))
        total = len(self.requests)
        events = self._events
        began = time.perf_counter()
        handled = 0
        every = max(1, total // 200)
        last = -1
        while events:
            t, _, fn = heapq.heappop(events)
            self.now = t
            fn(t)
            handled += 1
            if progress is not None and self._done // every != last:
                last = self._done // every
                progress(self._done, total)
        for replica in self.replicas:
            replica.end_idle(self.now)
        if progress is not None:
            progress(self._done, total)
        result = build_result(
            self.config, self.requests, self.now, self.replicas, self.links, self.tiers
        )
        result.run = {"wall_s": time.perf_counter() - began, "events": handled}
        return result


def simulate(
    config: SimConfig, requests: Sequence[TraceRequest], progress: Progress | None = None
) -> SimResult:
    """Run one simulation."""
    return Simulator(config, requests).run(progress)


__all__ = ["Simulator", "simulate"]
