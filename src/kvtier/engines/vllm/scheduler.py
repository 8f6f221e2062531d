"""The scheduler side of the connector (vLLM's EngineCore process): what to load and to store.

Per request it keys the tokens in the engine's namespace, with every other input that changes
the KV (LoRA adapter, cache salt, multimodal items, prompt embeddings: a request carrying one
that cannot be keyed safely is neither loaded nor stored), asks the tiers which leading chunks
they hold beyond what vLLM's own prefix cache has, lets the cost model pick how many to load
(:class:`~kvtier.engines.vllm.costs.OnlineCosts`, with the loads already in flight), and tells
vLLM the load is asynchronous: the request waits for its KV while the engine runs the others.
Each step it sends the worker the loads just allocated and, for every request the step
computes, the chunks the step completes that are worth storing (``admit``: by default every
chunk while recent prompts repeat chunks of earlier ones, else only the repeated ones, so a
workload without reuse pays almost nothing for the cache). It never moves KV itself, except
preloading: from the moment a request is queued, its chunks on slower tiers are copied up into
the first tier (in arrival order, within ``preload_bytes`` in flight, once it has waited
``PRELOAD_AFTER_S``), and a request whose KV is being moved when its turn comes is held back
(up to ``preload_wait_s``) while vLLM schedules others. With tensor parallelism a chunk is one
part per rank (:class:`~kvtier.engines.vllm.shards.Shards`): a lookup asks for every part at
once and counts a chunk only when all are there, and a chunk some rank lost its part of (a tier
evicted it, or a lookup found it missing) has the others' parts deleted from the same tier.

In a disaggregated fleet (vLLM's ``kv_role``) a producer tells whoever sends the request on how
many leading chunks it handed its tiers (``kv_transfer_params``: ``{"kvtier_chunks": n}``), and
a consumer given that count holds the request back (up to ``producer_wait_s``) until the tiers
show that many, since the producer's stores land asynchronously.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from kvtier.cache.results import LookupResult
from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.costs import OnlineCosts
from kvtier.engines.vllm.events import CacheEvents, SchedulerEvents, chunk_blocks
from kvtier.engines.vllm.groups import usable
from kvtier.engines.vllm.identity import EngineGeometry
from kvtier.engines.vllm.metadata import (
    ChunkLoad,
    KVTierMetadata,
    KVTierWorkerMeta,
    LoadJob,
    StoreJob,
)
from kvtier.engines.vllm.open_tiers import close_cache, open_cache
from kvtier.engines.vllm.records import RecordWriter, prompt_hash
from kvtier.engines.vllm.request_keys import AdapterIdentities, UnkeyableRequest, key_inputs
from kvtier.engines.vllm.shards import PartBook, Shards
from kvtier.engines.vllm.stats import ConnectorCounters
from kvtier.keys import PLAIN, ChunkKeyer, KeyInputs, Namespace
from kvtier.policy.store_admission import StoreAdmission

log = logging.getLogger("kvtier.vllm")

#: Seconds a chunk whose load failed is not offered again (a writer may replace it meanwhile).
BAD_KEY_S = 60.0
#: The key of ``kv_transfer_params`` a producer fills and a consumer reads: leading chunks stored.
CHUNKS_PARAM = "kvtier_chunks"
#: Seconds a request waits in vLLM's queue before its preload looks it up: one vLLM schedules at
#: once (the usual case with room in its pool) is looked up once, by vLLM's own call, not twice.
PRELOAD_AFTER_S = 0.05


@dataclass(frozen=True)
class _Asked:
    """What a lookup depended on when it was asked: the chunks (from ``local``, ``keys`` of
    them), the cache's state (``epoch``) and when."""

    local: int
    keys: int
    epoch: tuple[int, int]
    at: float

    def same_chunks(self, other: _Asked) -> bool:
        """Whether ``other`` asked for the same chunks."""
        return (self.local, self.keys) == (other.local, other.keys)


@dataclass(frozen=True)
class _Looked:
    """A lookup's answer."""

    asked: _Asked
    found: LookupResult


@dataclass(frozen=True)
class _Pending:
    """A lookup asked off EngineCore's loop, its answer still to come."""

    asked: _Asked
    future: Future[LookupResult]


class Preload(StrEnum):
    """Where a request's preload stands (the scheduler's only multi-step request state)."""

    NONE = ""  # no preload: not queued for one, or it gave way to vLLM's own scheduling
    QUEUED = "queued"  # waiting for the preloader
    LOOKING = "looking"  # the preloader is looking its chunks up
    MOVING = "moving"  # its chunks are being copied up: vLLM holds the request back (bounded)
    DONE = "done"  # the preloader is finished with it


#: The transitions allowed, written once: every change of a request's preload goes through
#: :meth:`_Request.move`. Any state may go back to NONE when the request finishes.
PRELOAD_MOVES: dict[Preload, frozenset[Preload]] = {
    Preload.NONE: frozenset({Preload.QUEUED}),
    Preload.QUEUED: frozenset({Preload.NONE, Preload.LOOKING}),  # scheduled first, or picked
    Preload.LOOKING: frozenset({Preload.NONE, Preload.MOVING, Preload.DONE}),
    Preload.MOVING: frozenset({Preload.NONE, Preload.DONE}),
    Preload.DONE: frozenset({Preload.NONE}),
}


@dataclass
class _Request:
    """What the scheduler side tracks of one live request."""

    request: Any
    arrived: float
    inputs: KeyInputs = PLAIN  # what besides token ids enters its keys
    unkeyable: str = ""  # why its KV cannot be keyed safely: it neither loads nor stores
    keys: list[bytes] = field(default_factory=list)
    keyed_tokens: int = 0
    block_ids: list[list[int]] = field(default_factory=list)  # per KV-cache group
    stored: int = 0  # leading chunks kvtier holds or was handed
    plan: tuple[int, int, list[int]] | None = None  # (local tokens, chunks wanted, tiers)
    load: LoadJob | None = None
    load_tokens: dict[str, int] = field(default_factory=dict)  # tokens per tier
    local_tokens: int = 0
    load_started: float = 0.0
    predicted_load_s: float = 0.0
    prefill_saved_s: float = 0.0
    preload: Preload = Preload.NONE
    preload_bytes: int = 0
    preloaded: int = 0
    recorded: bool = False
    failed: bool = False  # a load of this request failed: it recomputes from now on
    failed_blocks: set[int] = field(default_factory=set)  # of its load in flight, so far
    sync: bool = False  # its load runs inside the step that schedules it (host memory)
    decision: str = ""
    hit_chunks: int = 0  # chunks kvtier held beyond vLLM's cache at the last lookup
    repeats: list[bool] | None = None  # per prompt chunk: an earlier prompt held it too
    looked: _Looked | None = None  # its last lookup, reused while nothing it depends on changed
    pending: _Pending | None = None  # its lookup in flight off the loop (network tiers)
    saved: bool = False  # a step handed the worker chunks of it to save (copied asynchronously)

    def move(self, to: Preload) -> None:
        """Change the preload state along :data:`PRELOAD_MOVES` (the caller holds the lock)."""
        if to is not self.preload:
            assert to in PRELOAD_MOVES[self.preload], f"preload {self.preload} -> {to}"
            self.preload = to


class SchedulerSide:
    """The connector's scheduler half over ``config``'s tiers."""

    def __init__(
        self,
        config: ConnectorConfig,
        namespace: Namespace,
        geometry: EngineGeometry,
        events: bool = False,
    ):
        """``events``: vLLM publishes KV events; kvtier's stores and evictions join them."""
        self.config = config
        self.geometry = geometry
        self.chunk = config.chunk_tokens
        self.blocks_per_chunk = geometry.blocks_per_chunk(self.chunk)
        self.chunk_bytes = geometry.chunk_bytes(self.chunk)
        self.keyer = ChunkKeyer(namespace, self.chunk)
        self.shards = Shards(namespace)
        self._events = SchedulerEvents(self.shards.size) if events else None
        self._adapters = AdapterIdentities()
        self._unkeyable_seen: set[str] = set()  # reasons already logged at warning level
        # grows with every change to the tiers this half's cache does not see: a step that hands
        # the worker chunks to store, a worker report of blocks landed in or gone from its tiers
        self._changes_elsewhere = 0
        self.cache = open_cache(config, namespace, "scheduler", self.chunk_bytes)
        self.names = self.cache.names
        self.costs = OnlineCosts(self.names, self.chunk, self.chunk_bytes)
        # a lookup that may cross the network runs off EngineCore's loop
        remote = any(tier.capabilities.shared for tier in self.cache.tiers)
        self._lookups = (
            ThreadPoolExecutor(1, thread_name_prefix="kvtier-lookup") if remote else None
        )
        self.counters = ConnectorCounters(self.cache.metrics)
        self._admission = StoreAdmission(config.admit)
        self._reqs: dict[str, _Request] = {}
        self._loads: list[LoadJob] = []
        self._inflight: dict[str, _Request] = {}
        self._bad: dict[bytes, float] = {}  # keys whose load failed → until when to skip them
        self._lock = threading.Lock()
        self._keys_lock = threading.Lock()
        self._records = RecordWriter(config.records) if config.records else None
        self._preload_queue: deque[str] = deque()
        self._preload_wake = threading.Condition(self._lock)
        self._preload_in_flight = 0
        self._discards: list[tuple[bytes, str]] = []  # (chunk, tier) to delete every part of
        self._promoted: PartBook[bytes] = PartBook()  # the chunks of the parts it preloaded
        if self.shards.size > 1:
            self.cache.add_eviction_listener(self._on_evicted)
        # its preloads into host memory are announced like the worker's stores
        self._own_events = (
            CacheEvents(self.cache, config.tiers, geometry.block_size) if events else None
        )
        self._closed = False
        self._preloader: threading.Thread | None = None
        if config.preload:
            self._preloader = threading.Thread(
                target=self._preload_loop, name="kvtier-preload", daemon=True
            )
            self._preloader.start()

    # --- keys ------------------------------------------------------------------------------
    def _keys(self, st: _Request, tokens: int) -> list[bytes]:
        """Keys of the full chunks among the request's first ``tokens`` tokens."""
        if st.unkeyable:
            return []
        full = tokens // self.chunk
        keys = st.keys
        if full > len(keys):
            ids = st.request.all_token_ids[: full * self.chunk]
            keys = self.keyer.keys(np.asarray(ids, dtype=np.int64), st.inputs)
            with self._keys_lock:  # vLLM's thread and the preloader both key requests
                if len(keys) > len(st.keys):
                    st.keys = keys
        return keys[:full]

    def _usable(self, keys: list[bytes]) -> list[bytes]:
        """``keys`` up to the first one whose load failed lately (it is not offered again)."""
        if not self._bad:
            return keys
        now = time.monotonic()
        for key, until in list(self._bad.items()):
            if until <= now:
                del self._bad[key]
        for i, key in enumerate(keys):
            if key in self._bad:
                return keys[:i]
        return keys

    def _state(self, request) -> _Request:
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _Request(request, time.monotonic())
            try:
                st.inputs = key_inputs(request, self._adapters)
            except UnkeyableRequest as exc:
                self._refuse(st, str(exc))
            except Exception as exc:  # an input this code does not understand is not keyed
                self._refuse(st, f"cannot key its inputs ({type(exc).__name__}: {exc})")
        return st

    def _refuse(self, st: _Request, reason: str) -> None:
        """The request's KV cannot be keyed safely: it neither loads nor stores (counted)."""
        st.unkeyable = reason
        self.counters.add("unkeyable_requests")
        level = logging.DEBUG if reason in self._unkeyable_seen else logging.WARNING
        self._unkeyable_seen.add(reason)
        log.log(
            level, "kvtier neither loads nor stores request %s: %s", st.request.request_id, reason
        )

    # --- vLLM's scheduler calls ------------------------------------------------------------
    def on_new_request(self, request) -> None:
        """A request entered the queue: key it and, with preloading, queue its preload."""
        with self._lock:
            st = self._state(request)
            if self._preloader is not None:
                st.move(Preload.QUEUED)
                self._preload_queue.append(request.request_id)
                self._preload_wake.notify_all()

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        """Tokens kvtier will load beyond vLLM's ``num_computed_tokens`` (asynchronously)."""
        with self._lock:
            st = self._state(request)
            if st.repeats is None and self._admission.books:
                st.repeats = self._admission.sight(self._keys(st, request.num_tokens))
            st.local_tokens = num_computed_tokens
            held = time.monotonic() - st.arrived < self.config.preload_wait_s
            if st.preload is Preload.MOVING and held:
                self.counters.add("preload_holds")
                return None, False
            if st.preload is Preload.QUEUED:
                st.move(Preload.NONE)  # scheduled before its turn: it loads from where its KV is
                self._preload_queue.remove(request.request_id)
            elif st.preload is Preload.LOOKING:
                st.move(Preload.NONE)  # nothing is moving yet: the preload gives way
        if st.failed or not self.config.load:
            return 0, False
        try:
            keys = self._usable(self._keys(st, request.num_tokens))
            local = num_computed_tokens // self.chunk
            if len(keys) <= local:
                st.plan = None
                return 0, False
            found = self._lookup(st, local, keys)
        except Exception as exc:  # a tier that cannot answer is a miss, never a failed request
            log.warning("kvtier lookup failed (%s); recomputing", exc)
            return 0, False
        if found is None:  # asked off the loop: vLLM examines the request again next step
            self.counters.add("deferred_lookups")
            return None, False
        if self._awaits_producer(st, local + found.hit_chunks, len(keys)):
            st.looked = None  # asked anew next time: another engine's stores send no notice
            self.counters.add("producer_waits")
            return None, False
        st.hit_chunks = found.hit_chunks
        if found.hit_chunks == 0:
            st.plan = None
            st.stored = max(st.stored, local)
            return 0, False
        tiers = [self.names[t] for t in found.tiers]
        queued = self._queued_bytes()
        want, decision = self.costs.decide(request.num_tokens, local, tiers, queued)
        st.stored = max(st.stored, local + found.hit_chunks)
        if want <= local:
            st.plan = None
            st.decision = decision.action if decision is not None else "recompute"
            return 0, False
        wanted = want - local
        on_host = all(t == 0 for t in found.tiers[:wanted])
        # A load inside the step must leave vLLM a token to compute (its scheduler asserts so);
        # a load of the whole request goes asynchronously, and vLLM then recomputes the last
        # token itself when the load is done.
        leaves_one = want * self.chunk < request.num_tokens
        st.sync = on_host and self.config.sync_host and leaves_one
        st.decision = decision.action if decision is not None else "load (unmeasured)"
        st.plan = (num_computed_tokens, want, list(found.tiers[:wanted]))
        st.predicted_load_s = decision.predicted_load_s if decision else 0.0
        saved = self.costs.prefill_seconds(
            want * self.chunk - num_computed_tokens, num_computed_tokens
        )
        st.prefill_saved_s = saved or 0.0
        return want * self.chunk - num_computed_tokens, not st.sync

    def _awaits_producer(self, st: _Request, found: int, keyed: int) -> bool:
        """Whether the request's producer said it stored more leading chunks than the tiers
        show yet (``found``) and the request may still wait for them."""
        params = getattr(st.request, "kv_transfer_params", None)
        if not isinstance(params, dict):
            return False
        try:
            promised = min(int(params.get(CHUNKS_PARAM, 0)), keyed)
        except (TypeError, ValueError):
            return False
        waited = time.monotonic() - st.arrived
        return found < promised and waited < self.config.producer_wait_s

    def _lookup(self, st: _Request, local: int, keys: list[bytes]) -> LookupResult | None:
        """The tiers' answer for ``keys[local:]``: the request's last one while nothing it
        depends on changed (the same chunks asked, no store, eviction or outage since) and it
        is younger than ``lookup_ttl_s`` (other processes' stores send no notice), else asked
        anew. vLLM re-examines a waiting request every step; this keeps that free of tier I/O.
        With a tier across the network, asking anew happens on a thread of its own: None
        ("not yet") until its answer is in, so EngineCore's loop never waits on a round trip."""
        epoch = (self.cache.epoch, self._changes_elsewhere)
        asked = _Asked(local, len(keys), epoch, time.monotonic())
        memo = st.looked
        if (
            memo is not None
            and memo.asked.same_chunks(asked)
            and memo.asked.epoch == asked.epoch
            and asked.at - memo.asked.at < self.config.lookup_ttl_s
        ):
            self.counters.add("remembered_lookups")
            return memo.found
        if self._lookups is None:
            st.looked = _Looked(asked, self._look(keys[local:]))
            return st.looked.found
        pending = st.pending
        if pending is not None and pending.asked.same_chunks(asked):
            if not pending.future.done():
                return None
            st.pending = None
            # the answer as of when it was asked (raises what the lookup raised: a miss above)
            st.looked = _Looked(pending.asked, pending.future.result())
            return st.looked.found
        st.pending = _Pending(asked, self._lookups.submit(self._look, keys[local:]))
        return None

    def _look(self, keys: list[bytes]) -> LookupResult:
        """The tiers' answer for ``keys`` in chunks: every rank's part asked in one lookup, a
        chunk found only where all its parts are; a chunk found in part is queued for discard."""
        found = self.cache.lookup(self.shards.every_part(keys))
        partial = self.shards.partial(found)
        if partial is not None:
            with self._lock:
                self._discards.append((keys[partial], ""))
        return self.shards.whole(found)

    def _on_evicted(self, tier: str, part: bytes) -> None:
        """This half's tier evicted a part it preloaded: every part leaves that tier."""
        key = self._promoted.chunk(part)
        if key is not None:
            with self._lock:
                self._discards.append((key, tier))

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """vLLM allocated the request's blocks: plan the load into them."""
        st = self._state(request)
        if st.plan is not None or not st.recorded:  # once per lookup that got blocks
            self.counters.add("lookups")
            self.counters.add("hit_tokens", st.hit_chunks * self.chunk)
        st.hit_chunks = 0
        if num_external_tokens <= 0 or st.plan is None:
            if st.plan is None and not st.recorded:
                self._record(st, loaded_tokens=0)
            st.plan = None
            return
        local_tokens, want, tiers = st.plan
        st.plan = None
        groups = [list(ids) for ids in blocks.get_block_ids()]
        block_ids = groups[0]
        st.block_ids = groups
        bs = self.geometry.block_size
        first_block = local_tokens // bs
        end_block = (local_tokens + num_external_tokens) // bs
        chunks: list[ChunkLoad] = []
        keys = st.keys
        for c in range(local_tokens // self.chunk, want):
            b0 = c * self.blocks_per_chunk
            skip = max(0, first_block - b0)
            last = min(b0 + self.blocks_per_chunk, end_block)
            if last <= b0 + skip:
                break
            named = self._blocks(st, c) if self._events is not None else None
            every = tuple(tuple(g[b0 + skip : last]) for g in groups) if len(groups) > 1 else ()
            ids = tuple(block_ids[b0 + skip : last])
            chunks.append(ChunkLoad(keys[c], ids, skip, named, every))
        job = LoadJob(request.request_id, tuple(chunks), tuple(tiers[: len(chunks)]), sync=st.sync)
        by_tier: dict[str, int] = {}
        for chunk, t in zip(job.chunks, job.tiers, strict=True):
            name = self.names[t]
            by_tier[name] = by_tier.get(name, 0) + len(chunk.block_ids) * bs
        with self._lock:
            st.load = job
            st.load_tokens = by_tier
            st.load_started = time.monotonic()
            self._loads.append(job)
            self._inflight[request.request_id] = st
            self._release_preload(st)

    def build_connector_meta(self, scheduler_output) -> KVTierMetadata:
        """This step's loads (just allocated) and stores (chunks the step completes)."""
        with self._lock:
            loads, self._loads = self._loads, []
            discards, self._discards = self._discards, []
        meta = KVTierMetadata(loads=loads, discards=discards)
        for key, tier in discards:  # this half's own copies (its preloads) go too
            self.cache.discard(self.shards.every_part([key]), tier)
        scheduled = scheduler_output.num_scheduled_tokens
        computed: dict[str, int] = {}  # tokens each scheduled request had before this step
        for new in scheduler_output.scheduled_new_reqs:
            computed[new.req_id] = int(new.num_computed_tokens)
            st = self._reqs.get(new.req_id)
            if st is not None:
                st.block_ids = [list(ids) for ids in new.block_ids]
                self._plan_store(meta, st, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            computed[req_id] = int(cached.num_computed_tokens[i])
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = [list(ids) for ids in new_ids] if new_ids is not None else []
            elif new_ids is not None:
                if not st.block_ids:
                    st.block_ids = [[] for _ in new_ids]
                for mine, more in zip(st.block_ids, new_ids, strict=True):
                    mine.extend(more)
            self._plan_store(meta, st, cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        if meta.stores:
            self._changes_elsewhere += 1
        prefills = [(n, computed.get(r, 0)) for r, n in scheduled.items() if n > 1]
        if len(prefills) == 1 and scheduler_output.total_num_scheduled_tokens - prefills[0][0] < 8:
            meta.prefill = prefills[0]
        for req_id in scheduler_output.preempted_req_ids or ():
            meta.flush = True  # its blocks may be handed out this step: pending saves first
            st = self._reqs.get(req_id)
            if st is not None:
                st.block_ids = []
        return meta

    def _plan_store(self, meta: KVTierMetadata, st: _Request, computed: int) -> None:
        if not self.config.store or st.unkeyable:
            return
        full = computed // self.chunk
        if full <= st.stored:
            return
        if not st.block_ids or min(map(len, st.block_ids)) < full * self.blocks_per_chunk:
            return  # the blocks are not all known here (should not happen): store nothing
        keys = self._keys(st, full * self.chunk)
        bpc = self.blocks_per_chunk
        chosen = self._admission.admitted(range(st.stored, full), st.repeats)
        if len(chosen) < full - st.stored:
            self.counters.add("unadmitted_chunks", full - st.stored - len(chosen))
        # a chunk one of whose blocks vLLM already dropped (a sliding window's null block)
        # cannot be stored whole
        whole = [c for c in chosen if all(usable(g[c * bpc : (c + 1) * bpc]) for g in st.block_ids)]
        if len(whole) < len(chosen):
            self.counters.add("unstorable_chunks", len(chosen) - len(whole))
            chosen = whole
        st.stored = full
        if not chosen:
            return
        for c in chosen:  # a chunk stored anew may be offered again
            self._bad.pop(keys[c], None)
        st.saved = True
        meta.stores.append(
            StoreJob(
                st.request.request_id,
                tuple(keys[c] for c in chosen),
                tuple(tuple(st.block_ids[0][c * bpc : (c + 1) * bpc]) for c in chosen),
                blocks=tuple(self._blocks(st, c) for c in chosen) if self._events else (),
                groups=tuple(
                    tuple(tuple(g[c * bpc : (c + 1) * bpc]) for g in st.block_ids) for c in chosen
                )
                if len(st.block_ids) > 1
                else (),
            )
        )

    def _blocks(self, st: _Request, chunk: int):
        """Chunk ``chunk`` of the request in vLLM's block hashes (for KV events)."""
        return chunk_blocks(st.request, chunk, self.blocks_per_chunk, self.geometry.block_size)

    def update_connector_output(self, connector_output) -> None:
        """Loads the worker finished: count and record them; its measurements feed the cost
        model (both from the worker's report, :class:`KVTierWorkerMeta`)."""
        now = time.monotonic()
        failed = set(connector_output.invalid_block_ids or ())
        report = getattr(connector_output, "kv_connector_worker_meta", None)
        if not isinstance(report, KVTierWorkerMeta):
            report = KVTierWorkerMeta()
        waits = {req_id: now for req_id in connector_output.finished_recving or ()}
        synced = dict(report.synced)
        if failed:  # with tensor parallelism a rank's errors may come steps before the others
            with self._lock:  # finish: each in-flight load keeps the failures that are its own
                for st in self._inflight.values():
                    if st.load is not None:
                        st.failed_blocks |= failed.intersection(st.load.all_block_ids())
        for req_id in set(waits) | set(synced):
            with self._lock:
                st = self._inflight.pop(req_id, None)
            if st is None or st.load is None:
                continue
            wait = synced[req_id] if req_id in synced else now - st.load_started
            self._finish_load(st, wait, failed | st.failed_blocks, now)
        for new, cached, seconds in report.prefills:
            self.costs.observe_prefill(new, cached, seconds)
        for tier, nbytes, seconds, chunks in report.loads:
            self.costs.observe_load(tier, nbytes, seconds, chunks)
        if report.changed:
            self._changes_elsewhere += 1  # blocks landed in (or left) the worker's tiers
        if self._events is not None:
            self._events.add(getattr(connector_output, "kv_cache_events", None))
        if report.evicted and self.shards.size > 1:  # every rank drops its part there too
            with self._lock:
                self._discards.extend(dict.fromkeys(report.evicted))

    def _finish_load(self, st: _Request, wait: float, failed: set[int], now: float) -> None:
        assert st.load is not None
        chunks = st.load.chunks
        bad = [b for b in st.load.all_block_ids() if b in failed]
        whole = 0  # the chunks loaded before the first that failed (in any group)
        while whole < len(chunks) and not any(
            b in failed for b in st.load.all_block_ids(chunks[whole : whole + 1])
        ):
            whole += 1
        loaded_tokens = sum(len(c.block_ids) for c in chunks[:whole]) * self.geometry.block_size
        self.counters.observe("kv_wait_seconds", wait)
        self.counters.add("loaded_tokens", loaded_tokens)
        self.counters.add("predicted_load_seconds", st.predicted_load_s)
        if not bad:
            self.counters.add("prefill_seconds_saved", st.prefill_saved_s)
        else:
            st.failed = True
            until = now + BAD_KEY_S
            first_bad = None
            for chunk in chunks[whole:]:
                if any(b in failed for b in st.load.all_block_ids((chunk,))):
                    self._bad[chunk.key] = until
                    if first_bad is None:
                        first_bad = st.keys.index(chunk.key)
            if first_bad is not None:  # vLLM recomputes them: store them again, healing the tier
                st.stored = min(st.stored, first_bad)
        self._record(st, loaded_tokens=loaded_tokens, wait=wait, failed=len(bad))
        st.load = None
        st.failed_blocks = set()

    def request_finished(self, request, block_ids) -> tuple[bool, dict | None]:
        """A request is done: forget it. With asynchronous saves (``layerwise``), a request
        some step handed chunks of to save keeps its blocks until the worker reports them
        copied out (True). A producer answers with the leading chunks it handed its tiers, for
        the consumer that goes on."""
        with self._lock:
            st = self._reqs.pop(request.request_id, None)
            if st is not None:
                self._release_preload(st)
                if st.preload is Preload.QUEUED:
                    self._preload_queue.remove(request.request_id)
                st.move(Preload.NONE)
        held = st is not None and st.saved and self.config.layerwise
        if st is None or self.config.load or not self.config.store or st.unkeyable:
            return held, None
        return held, {CHUNKS_PARAM: st.stored}

    def take_stats(self):
        """Counters since the last call, as vLLM's stats object."""
        return self.counters.take()

    def take_events(self) -> list:
        """kvtier's KV events to publish since the last call (every rank's, merged)."""
        if self._events is None:
            return []
        if self._own_events is not None:
            self._events.add(self._own_events.take())
        return self._events.take()

    # --- records -----------------------------------------------------------------------------
    def _record(self, st: _Request, loaded_tokens: int, wait: float = 0.0, failed: int = 0):
        st.recorded = True
        if self._records is None:
            return
        req = st.request
        prompt = list(req.prompt_token_ids or [])
        hit = dict(st.load_tokens) if st.load is not None else {}
        line = {
            "req_id": req.request_id,
            "prompt_hash": prompt_hash(prompt),
            "prompt_tokens": int(getattr(req, "num_prompt_tokens", len(prompt))),
            "key_inputs": st.inputs.kinds(),
            "unkeyable": st.unkeyable or None,
            "local_hit_tokens": st.local_tokens,
            "hit_tokens": hit,
            "loaded_tokens": loaded_tokens,
            "load_wait_s": round(wait, 6),
            "predicted_load_s": round(st.predicted_load_s, 6),
            "decision": st.decision,
            "sync": st.sync,
            "preloaded_chunks": st.preloaded,
            "failed_blocks": failed,
            "preemptions": int(getattr(req, "num_preemptions", 0) or 0),
            "queued_s": round(max(0.0, st.load_started - st.arrived), 6) if st.load else None,
            "recorded_s": round(time.monotonic() - st.arrived, 6),
            "cost_samples": self.costs.prefill_samples,
        }
        self._records.write(line)

    # --- preloading ----------------------------------------------------------------------------
    def _queued_bytes(self) -> dict[str, float]:
        """Bytes of loads handed to the worker and not finished, per tier."""
        out: dict[str, float] = {}
        with self._lock:
            for st in self._inflight.values():
                for tier, tokens in st.load_tokens.items():
                    out[tier] = out.get(tier, 0.0) + tokens / self.chunk * self.chunk_bytes
        return out

    def _release_preload(self, st: _Request) -> None:
        """(Lock held.) The request's preloaded bytes are no longer waiting for it."""
        if st.preload_bytes:
            self._preload_in_flight -= st.preload_bytes
            st.preload_bytes = 0
            self._preload_wake.notify_all()

    def _preload_loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._preload_queue:
                    self._preload_wake.wait()
                if self._closed:
                    return
                req_id = self._preload_queue[0]
                st = self._reqs.get(req_id)
                if st is None or st.preload is not Preload.QUEUED:
                    self._preload_queue.popleft()
                    continue
                early = st.arrived + PRELOAD_AFTER_S - time.monotonic()
                if early > 0:  # vLLM may schedule it meanwhile (it then leaves the queue)
                    self._preload_wake.wait(early)
                    continue
                self._preload_queue.popleft()
                st.move(Preload.LOOKING)
            try:
                self._preload_one(st)
            except Exception as exc:  # a preload is only ever a head start
                log.warning("kvtier preload failed (%s)", exc)
            with self._lock:
                if st.preload in (Preload.LOOKING, Preload.MOVING):
                    st.move(Preload.DONE)

    def _preload_one(self, st: _Request) -> None:
        keys = self._keys(st, st.request.num_tokens)
        if not keys:
            return
        found = self._look(keys)
        slow = [i for i, t in enumerate(found.tiers) if t > 0]
        if not slow:
            return
        need = len(slow) * self.chunk_bytes
        with self._lock:
            while (
                not self._closed
                and self._preload_in_flight
                and self._preload_in_flight + need > self.config.preload_bytes
                and st.preload is Preload.LOOKING
            ):
                self._preload_wake.wait(0.05)
            if self._closed or st.preload is not Preload.LOOKING:
                return  # closing, or vLLM scheduled the request first: it loads on its own
            self._preload_in_flight += need
            st.preload_bytes = need
            st.move(Preload.MOVING)  # from here on vLLM holds the request back (up to a bound)
        hit = keys[: found.hit_chunks]
        parts = self.shards.every_part(hit)
        if self.shards.size > 1:
            self._promoted.remember(parts, self.shards.per_part(hit))
        if self._own_events is not None:
            named = [self._blocks(st, c) for c in range(len(hit))]
            self._own_events.expect(parts, self.shards.per_part(named))
        result = self.cache.prefetch(parts).result()
        st.preloaded = result.promoted // self.shards.size
        self.counters.add("preloaded_chunks", st.preloaded)

    def close(self) -> None:
        """Stop preloading and close the tiers."""
        with self._lock:
            self._closed = True
            self._preload_wake.notify_all()
        if self._preloader is not None:
            self._preloader.join(timeout=5)
        if self._lookups is not None:
            self._lookups.shutdown(wait=True, cancel_futures=True)
        close_cache(self.cache)
        if self._records is not None:
            self._records.close()


__all__ = ["CHUNKS_PARAM", "SchedulerSide", "prompt_hash"]
