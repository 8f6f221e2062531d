"""Which replica a request goes to: the fleet's routing policies, simulated.

- ``session``: every turn of a session goes to one replica (picked by a hash of the session's
  id that is the same in every run), so its prefix stays in that engine; one-shot requests go
  as ``least-loaded`` sends them.
- ``least-loaded``: the replica with the fewest requests on it or on their way to it; among
  equally loaded ones, the next after the last replica chosen (as nginx's ``least_conn``
  breaks ties), so an idle fleet shares the work rather than piling it on its first replicas.
- ``round-robin``: each replica in turn.
- ``prefix``: the replica whose engine's own prefix cache holds the longest leading run of the
  request's blocks, as KV-aware routers (llm-d's KV-cache indexer, Dynamo's router) score
  engines from their KV events; ties go as ``least-loaded`` sends them.
- ``tier``: the replica where the request's KV would be complete soonest, counting what
  kvtier's tiers hold: the engine's prefix costs nothing, the chunks in the replica's own tiers
  and in the shared tier (the same from any replica) cost their load seconds, the rest its
  prefill — the connector's load-or-recompute prediction
  (:meth:`~kvtier.sim.connector.Connector.estimate`) — plus the seconds its engine needs for
  the prefills already queued on it; the lowest wins, ties as ``least-loaded`` sends them.

A router sees what the engines hold when the request is sent: a block counts once its step has
registered it (a real router learns of it from the engine's events), a chunk once its write has
landed. Every choice is a pure function of the simulation's state, so a run is the same for the
same inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import xxhash

from kvtier.errors import ConfigError
from kvtier.sim.config import ROUTINGS, EngineSpec
from kvtier.sim.replica import Replica
from kvtier.sim.request import SimRequest
from kvtier.sim.timing import StepTimer


class Router:
    """Picks each request's replica by ``policy`` (one of :data:`~kvtier.sim.config.ROUTINGS`)
    and counts the requests on their way to each replica, so a burst sent at one instant
    spreads over the fleet."""

    def __init__(
        self, policy: str, replicas: Sequence[Replica], engine: EngineSpec, timer: StepTimer
    ):
        if policy not in ROUTINGS:
            raise ConfigError(f"routing is one of {', '.join(ROUTINGS)}, not {policy!r}")
        self.policy = policy
        self.replicas = list(replicas)
        self.engine = engine
        self.timer = timer
        self._transit = [0] * len(self.replicas)
        self._transit_tokens = [0] * len(self.replicas)
        self._turn = 0
        self._last = -1  # the replica chosen last: ties go to the next ones first
        budget = engine.max_batched_tokens
        #: seconds per prefilled token when the engine runs full steps (the queue's drain rate)
        self.token_s = timer.prefill_seconds(budget, 0) / budget

    # --- what the router sees of a replica ----------------------------------------------------
    def load(self, replica: Replica) -> int:
        """Requests on ``replica`` or sent to it and not yet there."""
        return replica.outstanding + self._transit[replica.index]

    def backlog_tokens(self, replica: Replica) -> int:
        """Prompt tokens the replica's engine still has to prefill for the requests on it or
        on their way to it."""
        on = chain(replica.waiting, replica.ready, replica.loading, replica.running)
        queued = sum(max(0, r.prompt - r.computed) for r in on)
        return queued + self._transit_tokens[replica.index]

    def engine_prefix(self, replica: Replica, r: SimRequest) -> int:
        """Leading blocks of ``r`` its engine's prefix cache holds (at least one prompt token
        is left to compute, as the scheduler leaves it)."""
        if not self.engine.prefix_caching:
            return 0
        limit = (r.num_tokens - 1) // self.engine.block_tokens
        return replica.pool.lookup(r.keys, limit)

    def ready_s(
        self, replica: Replica, r: SimRequest, now: float, memo: dict[tuple, float] | None = None
    ) -> float:
        """Predicted seconds until ``r``'s prompt KV would be complete on ``replica`` (its
        engine's prefix free, kvtier's chunks loaded, the rest prefilled), not counting its
        queue."""
        local = self.engine_prefix(replica, r) * self.engine.block_tokens
        connector = replica.connector
        if connector is None:
            return self.timer.prefill_seconds(max(r.num_tokens - local, 1), local)
        return connector.estimate(r, local, now, memo)

    def tier_score(
        self, replica: Replica, r: SimRequest, now: float, memo: dict[tuple, float] | None = None
    ) -> float:
        """The ``tier`` policy's score (lower is better): :meth:`ready_s` plus the seconds the
        replica's queued prefills take at its full-step rate."""
        return self.ready_s(replica, r, now, memo) + self.backlog_tokens(replica) * self.token_s

    # --- choosing ------------------------------------------------------------------------------
    def _after_last(self, replica: Replica) -> int:
        """Where ``replica`` stands among ties: the one after the last chosen first."""
        return (replica.index - self._last - 1) % len(self.replicas)

    def _least_loaded(self) -> Replica:
        return min(self.replicas, key=lambda rep: (self.load(rep), self._after_last(rep)))

    def choose(self, r: SimRequest, now: float) -> Replica:
        """The replica ``r`` goes to under the policy (books nothing)."""
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        policy = self.policy
        if policy == "session":
            session = r.trace.session
            if session is not None:
                return reps[xxhash.xxh64_intdigest(session.encode()) % len(reps)]
            return self._least_loaded()
        if policy == "round-robin":
            return reps[(self._turn + 1) % len(reps)]
        if policy == "prefix":
            return min(
                reps,
                key=lambda rep: (
                    -self.engine_prefix(rep, r),
                    self.load(rep),
                    self._after_last(rep),
                ),
            )
        if policy == "tier":
            memo: dict[tuple, float] = {}
            score = self.tier_score
            return min(
                reps,
                key=lambda rep: (score(rep, r, now, memo), self.load(rep), self._after_last(rep)),
            )
        return self._least_loaded()

    def route(self, r: SimRequest, now: float) -> Replica:
        """Choose ``r``'s replica and count it as on its way there."""
        replica = self.choose(r, now)
        if self.policy == "round-robin":
            self._turn += 1
        self._last = replica.index
        self._transit[replica.index] += 1
        self._transit_tokens[replica.index] += r.prompt
        return replica

    def arrived(self, replica: Replica, r: SimRequest) -> None:
        """``r`` reached ``replica`` (it counts there now, or was refused)."""
        self._transit[replica.index] -= 1
        self._transit_tokens[replica.index] -= r.prompt


__all__ = ["Router"]
