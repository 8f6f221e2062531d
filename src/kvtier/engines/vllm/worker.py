"""The worker side of the connector (vLLM's Worker process): KV bytes in and out of paged blocks.

Loads run on a background thread while the engine computes other requests: each chunk is read
from the tier that holds it into a staging buffer and scattered into the request's blocks, and
the request is reported finished loading; a chunk that is missing, corrupt or on a failing tier
stops its request's load there and its blocks (and the rest) are reported as load errors, so
vLLM recomputes them — never wrong KV, never a failed request. After each forward, the chunks the
step completed are gathered from the paged blocks (one copy, while the blocks still belong to
their request) and handed to kvtier's writer threads, which store them without holding up the
engine; a full write queue drops chunks and counts them.

The worker also times each forward and each load and sends them to the scheduler side, whose
cost model learns from them. With tensor parallelism each rank's worker moves its own part of
every chunk (its heads), under the part's own key (:class:`~kvtier.engines.vllm.shards.Shards`),
and reports the chunks whose part its tiers evicted, so that the other ranks drop theirs.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from kvtier.cache import Lease, LoadResult, StagingPool
from kvtier.codec import BlockError, BlockHeader, BlockMeta
from kvtier.engines.transfer import (
    LoadProgress,
    Placement,
    TransferEngine,
    open_transfer_engine,
)
from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.dtype import SHORT_NAMES
from kvtier.engines.vllm.events import CacheEvents, KVTierEvents
from kvtier.engines.vllm.groups import KVGroups
from kvtier.engines.vllm.identity import EngineGeometry
from kvtier.engines.vllm.metadata import KVTierMetadata, KVTierWorkerMeta, LoadJob, StoreJob
from kvtier.engines.vllm.open_tiers import close_cache, open_cache
from kvtier.engines.vllm.shards import PartBook, Shards
from kvtier.engines.vllm.stats import ConnectorCounters, KVTierStats
from kvtier.errors import ConfigError
from kvtier.keys import Namespace

log = logging.getLogger("kvtier.vllm")

_LAYER_INDEX = re.compile(r"(\d+)")
#: A synchronous load of at least twice this many chunks is split in two halves run at once.
SPLIT_CHUNKS = 4
#: The longest a load's chunks stay pinned against this worker's own evictions (the pin is
#: released as soon as the load ends; this bounds it if a load never does).
LOAD_PIN_S = 60.0
#: The longest a forward waits in one attention layer for its KV (a load that never lands is
#: then left to the step's end, where its blocks are reported as load errors).
LAYER_WAIT_S = 60.0


@dataclass
class StepSave:
    """The chunks a step completed, copied out layer by layer as the forward finishes each
    layer (on the worker's save thread), then handed to the tiers after the step."""

    jobs: list[StoreJob]
    places: list[Placement]
    bufs: list[np.ndarray]
    copied: set[int] = field(default_factory=set)  # layers already handed to the save thread
    failed: bool = False  # a layer could not be copied: no chunk of it is stored


@dataclass
class StepLoad:
    """The loads a step's forward waits for, moving layer by layer beside it: what was read
    (placements and host buffers, kept until the step ends) and each layer's progress."""

    progress: LoadProgress
    future: Future | None = None
    places: list[Placement] = field(default_factory=list)
    bufs: list = field(default_factory=list)
    lent: list = field(default_factory=list)  # the engine's buffers among them, given back


def layer_names(kv_caches: Mapping[str, torch.Tensor]) -> list[str]:
    """The layers' names ordered by layer number (the first integer in each name)."""

    def index(name: str) -> tuple[int, str]:
        m = _LAYER_INDEX.search(name)
        return (int(m.group(1)) if m else -1, name)

    return sorted(kv_caches, key=index)


class WorkerSide:
    """The connector's worker half over ``config``'s tiers."""

    def __init__(
        self,
        config: ConnectorConfig,
        namespace: Namespace,
        geometry: EngineGeometry,
        warm_tokens: int = 0,
        rank: int = 0,
        events: bool = False,
        groups: KVGroups | None = None,
    ):
        """``warm_tokens``: the longest request the engine takes; staging for a load that long is
        mapped and faulted in when the caches are registered, not during the first load.
        ``rank``: this worker's tensor-parallel rank (its part of each chunk). ``events``: vLLM
        publishes KV events; what this worker's tiers store and drop joins them. ``groups``:
        vLLM's KV-cache groups (which block table each layer uses; one by default)."""
        self.config = config
        self.geometry = geometry
        self.rank = rank
        self.shards = Shards(namespace)
        self.lead = rank == 0  # counts what is per chunk or per token, not per part
        self.groups = groups or KVGroups.single()
        self._layer_group: list[int] = []  # each layer's KV-cache group, in layer order
        self.chunk = config.chunk_tokens
        self.blocks_per_chunk = geometry.blocks_per_chunk(self.chunk)
        self.chunk_bytes = geometry.chunk_bytes(self.chunk)
        self.cache = open_cache(config, namespace, "worker", self.chunk_bytes)
        # host buffers the saves copy chunks into, back from the writers once stored
        self._staging = StagingPool.within(self.chunk_bytes)
        self.names = self.cache.names
        self.counters = ConnectorCounters(self.cache.metrics)
        self.engine: TransferEngine | None = None  # set when vLLM registers its caches
        self._straight: tuple[int, Any] | None = None  # a tier that reads into device memory
        self._warm = -(-warm_tokens // self.chunk) if warm_tokens > 0 else 0
        self._meta = BlockMeta(dtype=SHORT_NAMES.get(geometry.dtype, "u8"))
        self._pool = ThreadPoolExecutor(config.load_workers, thread_name_prefix="kvtier-load")
        self._sync_pool = ThreadPoolExecutor(1, thread_name_prefix="kvtier-sync-load")
        self._save_pool = ThreadPoolExecutor(1, thread_name_prefix="kvtier-save")
        self._step_save: StepSave | None = None
        self._saves_handed = False  # the bound step's saves went to the tiers (or the thread)
        self._saving: dict[str, list[Future]] = {}  # request → its saves still in flight
        self._finished_saving: set[str] = set()  # finished requests vLLM holds for their saves
        self._nothing: Future = Future()  # a save that was never to be made: done already
        self._nothing.set_result(None)
        self._loading: dict[str, Future] = {}
        self._errors: set[int] = set()
        self._lock = threading.Lock()
        self._report = KVTierWorkerMeta()  # what the scheduler side hears after the step
        self._reported_epoch = 0  # the cache's epoch at the last report to the scheduler
        self._bound_at = 0.0
        self._sync_s = 0.0  # seconds the step's forward waited for KV (not the forward's own)
        self._step_load: StepLoad | None = None
        self._layer_of: dict[str, int] = {}  # a layer's name → its index in the caches
        self._registered: dict[str, torch.Tensor] | None = None  # vLLM's caches, by layer name
        self._meta_now: KVTierMetadata | None = None
        self._parts_of: PartBook[bytes] = PartBook()  # the chunks of the parts it stored or loaded
        if self.shards.size > 1:
            self.cache.add_eviction_listener(self._on_evicted)
        self._announcer = (
            CacheEvents(self.cache, config.tiers, geometry.block_size) if events else None
        )

    # --- set-up -------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        """Take vLLM's paged KV tensors (one view per layer, blocks first) and check they are
        what kvtier moves: pages adding up to the geometry's chunk, on CPU or CUDA."""
        self._registered = dict(kv_caches)
        names = layer_names(kv_caches)
        caches = [kv_caches[n] for n in names]
        self._layer_of = {name: i for i, name in enumerate(names)}
        self._layer_group = self.groups.of_layers(names)
        keep = max(64, 2 * self._warm)
        engine = open_transfer_engine(
            caches, self.geometry.block_size, self.chunk, self.config.staging_bytes, keep
        )
        g = self.geometry
        if engine.chunk_bytes != self.chunk_bytes or engine.kv.num_layers != g.layers:
            engine.close()
            raise ConfigError(
                f"vLLM's KV cache is {len(caches)} × {tuple(caches[0].shape)} "
                f"{caches[0].dtype} ({engine.chunk_bytes} bytes a chunk); kvtier expected "
                f"{g.layers} layers and {self.chunk_bytes} bytes a chunk: this vLLM layout "
                "is not supported"
            )
        self.engine = engine
        self._straight = straight_tier(self.cache.tiers)
        engine.give_buffers(engine.take_buffers(self._warm))  # mapped and faulted in now

    def unregister_kv_caches(self) -> None:
        """Let go of the engine's caches before vLLM's sleep mode remaps them: finish every
        load, drop the transfer engine's views (idempotent)."""
        self._settle_step_load()
        futures.wait(list(self._loading.values()))  # reported finished by get_finished, as ever
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def restore_kv_caches(self) -> None:
        """Take the caches back after vLLM's sleep mode woke up (idempotent)."""
        if self.engine is None and self._registered is not None:
            self.register_kv_caches(self._registered)

    # --- one step -------------------------------------------------------------------------------
    def bind(self, meta: KVTierMetadata) -> None:
        """The step's metadata arrived (the forward starts now)."""
        self._meta_now = meta
        self._saves_handed = False
        self._step_save = None
        self._bound_at = time.perf_counter()
        self._sync_s = 0.0

    def unbind(self) -> None:
        """The step is over: its metadata no longer applies (a load it started has ended, its
        saves are handed on even where vLLM did not wait for them)."""
        self._settle_step_load()
        meta = self._meta_now
        if meta is not None and meta.stores and not self._saves_handed:
            self.wait_for_save()
        self._step_save = None
        self._meta_now = None

    def start_load_kv(self) -> None:
        """Start the step's loads in the background (called after the forward is launched)."""
        meta = self._meta_now
        if meta is None:
            return
        for key, tier in meta.discards:  # another rank lost its part there: this one is useless
            self.cache.discard([self.shards.key(key, self.rank)], tier)
        # Every chunk of the step's loads is pinned first, so that neither the chunks this
        # worker stores meanwhile nor the promotions of another load evict one before it is read.
        pins = [self.cache.pin(self._parts(job), LOAD_PIN_S) for job in meta.loads]
        after = self._compute_event() if meta.loads else None  # e.g. vLLM zeroing new blocks
        waited = []
        for job, pin in zip(meta.loads, pins, strict=True):
            if not job.sync:
                self._loading[job.req_id] = self._pool.submit(self._load_pinned, job, pin, after)
            elif self.config.layerwise and self.engine is not None:
                waited.append((job, pin))  # read now, placed layer by layer beside the forward
            else:  # the whole load before the forward that uses it (vLLM calls this first then)
                began = time.perf_counter()
                with pin:
                    self._errors.update(self._load_now(job, after))
                took = time.perf_counter() - began
                self._blocked(took)
                with self._lock:
                    self._report.synced.append((job.req_id, took))
        if waited and self.engine is not None:
            self._step_load = self._read_step(waited, after)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Wait until this layer of the step's loads is in place (the other layers may still
        be moving)."""
        step = self._step_load
        if step is None:
            return
        began = time.perf_counter()
        layer = self._layer_of.get(layer_name)
        if layer is None:
            step.progress.wait(LAYER_WAIT_S)
        elif not step.progress.wait_layer(layer, LAYER_WAIT_S):
            log.warning(
                "kvtier's load of layer %s did not land in %.0f s", layer_name, LAYER_WAIT_S
            )
        self._blocked(time.perf_counter() - began)

    def _blocked(self, seconds: float) -> None:
        """The forward waited ``seconds`` for KV."""
        self._sync_s += seconds
        self.counters.add("forward_blocked_seconds", seconds)

    def _read_step(self, jobs: list[tuple[LoadJob, Lease]], after) -> StepLoad:
        """Read every chunk of the step's waited-for loads now (before the forward goes on: a
        read beside it would compete with the forward's threads for the cores), then place
        them layer by layer on the sync-load thread, marking each layer as it lands."""
        engine = self.engine
        assert engine is not None
        step = StepLoad(LoadProgress(engine.kv.num_layers))
        began = time.perf_counter()
        failed: list[int] = []
        try:
            for job, pin in jobs:
                with pin:
                    bufs = engine.take_buffers(len(job.chunks))
                    if len(bufs) < len(job.chunks):  # a ring smaller than the load: plain ones
                        engine.give_buffers(bufs)
                        bufs = [np.empty(self.chunk_bytes, np.uint8) for _ in job.chunks]
                    else:
                        step.lent.extend(bufs)
                    for (loaded, result, into), part in self._read_halves(job, bufs):
                        done = part.chunks[:loaded]
                        step.places += [self._placement(c.group_ids, c.skip) for c in done]
                        step.bufs += into[:loaded]
                        failed += self._failed(part, loaded, result)
        except Exception as exc:  # a bug in a load must not fail the request: recompute
            log.warning("kvtier's read of a step's loads raised (%s); vLLM recomputes", exc)
            self.counters.add("load_errors", sum(len(job.chunks) for job, _ in jobs))
            failed = [b for job, _ in jobs for b in job.all_block_ids()]
            step.places, step.bufs = [], []
        self._errors.update(failed)
        read_s = time.perf_counter() - began
        self._blocked(read_s)
        step.future = self._sync_pool.submit(self._place_layerwise, jobs, step, after, read_s)
        return step

    def _read_halves(self, job: LoadJob, bufs: list[np.ndarray]):
        """Read a load into ``bufs``; a long one as two halves at once (this thread and the
        sync-load thread: reads release the GIL), as a whole load does. Each half's (loaded,
        result, its chunks) with its part of the job."""
        half = len(job.chunks) // 2
        if half < SPLIT_CHUNKS:
            return [(self._read(job, bufs), job)]
        first, rest = _part(job, 0, half), _part(job, half, len(job.chunks))
        second = self._sync_pool.submit(self._read, rest, bufs[half:])
        got = self._read(first, bufs[:half])
        return [(got, first), (second.result(), rest)]

    def _place_layerwise(
        self, jobs: list[tuple[LoadJob, Lease]], step: StepLoad, after, read_s: float
    ) -> list[int]:
        """Place a step's read chunks layer by layer; the block ids that failed. Whatever
        happens, every layer is marked in the end, so no attention layer waits forever."""
        engine = self.engine
        assert engine is not None
        began = time.perf_counter()
        failed: list[int] = []
        try:
            engine.to_device(step.places, step.bufs, step.progress, layerwise=True, after=after)
        except Exception as exc:  # a bug in a load must not fail the request: recompute
            log.warning("kvtier's layer-by-layer placing raised (%s); vLLM recomputes", exc)
            self.counters.add("load_errors", len(step.places))
            failed = [b for p in step.places for ids in p.ids_by_layer for b in ids]
        finally:
            step.progress.finish()
            took = read_s + time.perf_counter() - began
            self.counters.add("measured_load_seconds", took)
            with self._lock:  # the scheduler finishes these loads with this step
                for job, _ in jobs:
                    self._report.synced.append((job.req_id, took / len(jobs)))
        return failed

    def _load_pinned(self, job: LoadJob, pin: Lease, after=None) -> list[int]:
        """An asynchronous load, its chunks unpinned once it ends."""
        with pin:
            return self._load(job, after)

    def _load_now(self, job: LoadJob, after=None) -> list[int]:
        """A synchronous load: the engine waits for it, so both halves of a long one are read
        and scattered at once (this thread and one helper: reads and copies release the GIL)."""
        half = len(job.chunks) // 2
        if half < SPLIT_CHUNKS:
            return self._load(job, after)
        second = self._sync_pool.submit(self._load, _part(job, half, len(job.chunks)), after)
        failed = self._load(_part(job, 0, half), after)
        return failed + second.result()

    def _load(self, job: LoadJob, after=None) -> list[int]:
        """Read and place one request's chunks, as many at a time as the engine lends host
        buffers for; the block ids that failed."""
        engine = self.engine
        if engine is None or not job.chunks:
            return job.all_block_ids()
        done = 0
        while done < len(job.chunks):
            bufs = engine.take_buffers(len(job.chunks) - done)
            part = _part(job, done, done + len(bufs))
            try:
                failed = self._load_into(part, engine, bufs, after)
            finally:
                engine.give_buffers(bufs)  # kept mapped (pinned, on CUDA) for the next load
            done += len(part.chunks)
            if failed:
                return failed + job.all_block_ids(job.chunks[done:])
        return []

    def _parts(self, job: LoadJob) -> list[bytes]:
        """The keys of this rank's parts of a load's chunks."""
        return self.shards.keys([c.key for c in job.chunks], self.rank)

    def _load_into(
        self, job: LoadJob, engine: TransferEngine, bufs: list[np.ndarray], after=None
    ) -> list[int]:
        began = time.perf_counter()
        loaded, result, chunks = self._read(job, bufs)
        if loaded:
            places = [self._placement(c.group_ids, c.skip) for c in job.chunks[:loaded]]
            engine.to_device(places, chunks[:loaded], after=after)
        self.counters.add("measured_load_seconds", time.perf_counter() - began)
        return self._failed(job, loaded, result)

    def _read(
        self, job: LoadJob, bufs: list[np.ndarray]
    ) -> tuple[int, LoadResult | None, list[Any]]:
        """Read a load's leading chunks and count them: how many were read, the cache's
        result (None: it raised), and the chunks to place (``bufs``, but for the leading ones
        a tier read straight into device memory)."""
        keys = self._parts(job)
        if self._announcer is not None:  # its promotions into faster tiers are announced
            self._announcer.expect(keys, [c.blocks for c in job.chunks])
        began = time.perf_counter()
        chunks: list[Any] = list(bufs)
        straight = self._read_straight(job, keys, chunks)
        try:
            where = job.tiers[straight:] if job.tiers_per_chunk else None
            result = self.cache.load(keys[straight:], bufs[straight:], promised=True, where=where)
            loaded = straight + result.loaded
        except Exception as exc:  # the cache never raises for a tier; this is a last guard
            log.warning("kvtier load failed (%s); vLLM recomputes", exc)
            loaded = straight
            result = None
        read_s = time.perf_counter() - began
        if loaded and self.shards.size > 1:  # its promotions may be evicted later: report them
            self._parts_of.remember(keys[:loaded], [c.key for c in job.chunks[:loaded]])
        if loaded:
            first = [self._straight[0]] * straight if self._straight is not None else []
            tiers = first + list(result.tiers[: loaded - straight] if result is not None else [])
            for t in sorted(set(tiers)):
                n = tiers.count(t)
                name = self.names[t]
                share = read_s * n / loaded
                nbytes = n * self.chunk_bytes
                self.counters.add("tier_loaded_bytes", nbytes, tier=name)
                self.counters.add("tier_load_seconds", share, tier=name)
                tokens = sum(
                    len(c.block_ids) for c, tt in zip(job.chunks, tiers, strict=False) if tt == t
                )
                if self.lead:
                    bs = self.geometry.block_size
                    self.counters.add("tier_hit_tokens", tokens * bs, tier=name)
                with self._lock:
                    self._report.loads.append((name, nbytes, share, n))
        return loaded, result, chunks

    def _read_straight(self, job: LoadJob, keys: list[bytes], chunks: list[Any]) -> int:
        """Read the leading chunks the scheduler found in a tier that reads straight into
        device memory (``file://…&gds=1``) there, putting them in ``chunks``; how many. A
        chunk it cannot serve ends the run (the cache's host path reads the rest); a damaged
        one is deleted from that tier."""
        if self._straight is None or self.engine is None or not job.tiers_per_chunk:
            return 0  # without a tier per chunk, the cache finds them
        index, tier = self._straight
        run = 0
        while run < len(keys) and job.tiers[run] == index:
            run += 1
        if run == 0:
            return 0
        device = torch.device(self.engine.kv.device)
        outs = [torch.empty(self.chunk_bytes, dtype=torch.uint8, device=device) for _ in keys[:run]]
        try:
            results = tier.read_device(keys[:run], outs)
        except Exception as exc:  # the host path is still there: read through it
            log.warning("kvtier's read into device memory failed (%s); reading through host", exc)
            return 0
        n = 0
        while n < run and isinstance(results[n], BlockHeader):
            n += 1
        bad = [k for k, r in zip(keys, results, strict=False) if isinstance(r, BlockError)]
        if bad:
            self.cache.discard(bad, self.names[index])
        chunks[:n] = [o if o.device.type != "cpu" else o.numpy() for o in outs[:n]]
        return n

    def _failed(self, job: LoadJob, loaded: int, result: LoadResult | None) -> list[int]:
        """The block ids of a load's chunks past the ``loaded`` first, counted and logged."""
        failed = job.all_block_ids(job.chunks[loaded:])
        if failed:
            self.counters.add("load_errors", len(job.chunks) - loaded)
            log.warning(
                "kvtier loaded %d of %d chunks for %s; vLLM recomputes the rest (%s)",
                loaded,
                len(job.chunks),
                job.req_id,
                self._why_short(result, len(job.chunks)),
            )
        return failed

    def _why_short(self, result: LoadResult | None, wanted: int) -> str:
        """Why a load served fewer chunks than the scheduler's lookup promised."""
        if result is None:
            return "the cache raised"
        why = []
        if result.located < wanted:
            why.append(f"{wanted - result.located} not found here")
        if result.corrupt:
            why.append(f"{result.corrupt} bad block(s)")
        if result.errors:
            why.append(f"{result.errors} read(s) failed or skipped, {result.skipped} skipped")
        down = [n for i, n in enumerate(self.names) if not self.cache.tier_up(i)]
        if down:
            why.append("breaker open: " + ", ".join(down))
        return "; ".join(why) or "no reason recorded"

    def wait_for_save(self) -> None:
        """Settle the step's layer-by-layer loads (their failed blocks become load errors of
        this step); time the step's forward; copy out the chunks it completed and queue them."""
        self._settle_step_load()
        meta = self._meta_now
        if meta is not None and meta.prefill is not None and self.lead:
            # bind → here spans the forward, with any synchronous loads before it taken out
            forward_s = time.perf_counter() - self._bound_at - self._sync_s
            new, cached = meta.prefill
            with self._lock:
                self._report.prefills.append((new, cached, forward_s))
        engine = self.engine
        if meta is None or not meta.stores or self._saves_handed:
            return
        self._saves_handed = True
        if engine is None:  # nothing to copy from; vLLM still waits to hear the saves ended
            if self.config.layerwise:
                for job in meta.stores:
                    self._saving.setdefault(job.req_id, []).append(self._nothing)
            return
        began = time.perf_counter()
        if self.config.layerwise:  # the rest of the layers and the stores, off the forward
            save = self._step_save or self._begin_save(meta)
            self._step_save = None
            rest = [i for i in range(engine.kv.num_layers) if i not in save.copied]
            done = self._save_pool.submit(self._finish_save, save, rest, self._compute_event())
            for job in save.jobs:  # vLLM holds their blocks until get_finished says so
                self._saving.setdefault(job.req_id, []).append(done)
        else:
            for job in meta.stores:
                bufs = self._staging.take(len(job.keys))
                try:
                    engine.to_host(self._store_places(job), bufs)
                except BaseException:
                    self._give_back(bufs)
                    raise
                self._store(job, bufs)
        self.counters.add("store_seconds", time.perf_counter() - began)

    def save_kv_layer(self, layer_name: str) -> None:
        """The forward finished this layer: copy its blocks of the chunks the step completes
        on the save thread while the forward goes on (layer-by-layer mode)."""
        meta, engine = self._meta_now, self.engine
        if not self.config.layerwise or meta is None or engine is None or not meta.stores:
            return
        save = self._step_save or self._begin_save(meta)
        layer = self._layer_of.get(layer_name)
        if layer is None or layer in save.copied:
            return
        save.copied.add(layer)
        self._save_pool.submit(self._copy_layer, save, layer, self._compute_event())

    def _begin_save(self, meta: KVTierMetadata) -> StepSave:
        """The step's chunks to save: their placements and host buffers to copy them into."""
        places = [p for job in meta.stores for p in self._store_places(job)]
        bufs = self._staging.take(len(places))
        self._step_save = StepSave(list(meta.stores), places, bufs)
        return self._step_save

    def _store_places(self, job: StoreJob) -> list[Placement]:
        return [self._placement(functools.partial(job.group_ids, i)) for i in range(len(job.keys))]

    def _compute_event(self):
        """On CUDA, an event on the forward's stream now (what a copy must wait for)."""
        engine = self.engine
        if engine is None or engine.kv.device == "cpu":
            return None
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def _copy_layer(self, save: StepSave, layer: int, after) -> None:
        assert self.engine is not None
        try:
            self.engine.to_host(save.places, save.bufs, [layer], after)
        except Exception as exc:  # a save is only a later hit: the finish drops the chunks
            log.warning("kvtier could not copy layer %d out (%s)", layer, exc)
            save.failed = True

    def _finish_save(self, save: StepSave, rest: list[int], after) -> None:
        """Copy the layers the forward did not report, then hand every chunk to the tiers."""
        start = 0  # save.bufs[:start] are the cache's now
        try:
            if rest and self.engine is not None:
                self.engine.to_host(save.places, save.bufs, rest, after)
            if save.failed:  # a chunk missing a layer is never stored
                self.counters.add("dropped_chunks", len(save.places))
                return
            for job in save.jobs:
                bufs = save.bufs[start : start + len(job.keys)]
                start += len(job.keys)  # the cache's from here, even if _store fails after
                self._store(job, bufs)  # handing them over: never given back twice
        except Exception as exc:  # a dropped save is a later miss, never a failed request
            log.warning("kvtier dropped a step's saves (%s)", exc)
            self.counters.add("dropped_chunks", len(save.places))
        finally:
            self._give_back(save.bufs[start:])

    def _give_back(self, bufs: list[np.ndarray]) -> None:
        """Return save buffers the cache was never handed to the pool."""
        for buf in bufs:
            self._staging.give(buf)

    def _store(self, job: StoreJob, bufs: list[np.ndarray]) -> None:
        """Hand one job's copied-out chunks to the tiers' writers."""
        parts = self.shards.keys(job.keys, self.rank)
        if self._announcer is not None and job.blocks:
            self._announcer.expect(parts, job.blocks)
        taken = self.cache.store(
            parts, bufs, meta=self._meta, copy=False, release=self._staging.give
        )
        if self.shards.size > 1:
            self._parts_of.remember(parts, job.keys)
        if self.lead:
            self.counters.add("stored_chunks", taken)
        if taken < len(job.keys):  # any rank's dropped part drops the chunk
            self.counters.add("dropped_chunks", len(job.keys) - taken)

    def flush_saves(self) -> None:
        """Wait until every save handed to the save thread is done (its blocks are free)."""
        self._save_pool.submit(lambda: None).result()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every save is copied out and written to every tier it goes to."""
        self.flush_saves()
        return self.cache.flush(timeout)

    def handle_preemptions(self, meta: KVTierMetadata | None) -> None:
        """vLLM preempted a request: blocks may change hands this step, so saves finish first."""
        if meta is not None and meta.flush and self._saving:
            self.flush_saves()

    def _settle_step_load(self) -> None:
        """Wait for the step's layer-by-layer load to end and take its failed blocks."""
        step, self._step_load = self._step_load, None
        if step is None or step.future is None:
            return
        try:
            self._errors.update(step.future.result())
        finally:
            if self.engine is not None:
                self.engine.give_buffers(step.lent)

    def _placement(self, group_ids, skip: int = 0) -> Placement:
        """Where a chunk's blocks are: each layer's ids from its KV-cache group's table."""
        return Placement(tuple(tuple(group_ids(g)) for g in self._layer_group), skip)

    def _on_evicted(self, tier: str, part: bytes) -> None:
        """A tier evicted one of this rank's parts: the chunk is gone from it for every rank."""
        key = self._parts_of.chunk(part)
        if key is not None:
            with self._lock:
                self._report.evicted.append((key, tier))

    def get_finished(self) -> set[str]:
        """Requests whose load finished (their failed blocks go to :meth:`take_errors`)."""
        done: set[str] = set()
        for req_id, fut in list(self._loading.items()):
            if not fut.done():
                continue
            del self._loading[req_id]
            try:
                failed = fut.result()
            except Exception as exc:  # a bug in a load must not fail the request: recompute
                log.warning("kvtier load of %s raised (%s); vLLM recomputes", req_id, exc)
                failed = []
                self.counters.add("load_errors", 1)
            self._errors.update(failed)
            done.add(req_id)
        return done

    def get_finished_saving(self, finished_req_ids: set[str] | frozenset) -> set[str]:
        """Finished requests vLLM holds for their saves whose saves are all done (their
        blocks may go back to vLLM): every request a step handed chunks of to save, once it
        finished, is reported here exactly once."""
        self._finished_saving |= {r for r in finished_req_ids if r in self._saving}
        sent = {r for r in self._finished_saving if all(f.done() for f in self._saving[r])}
        for req_id in sent:
            self._finished_saving.discard(req_id)
            del self._saving[req_id]
        return sent

    def take_errors(self) -> set[int]:
        """Blocks that failed to load since the last call."""
        errors, self._errors = self._errors, set()
        return errors

    def take_events(self) -> KVTierEvents | None:
        """KV events of this worker's tiers since the last call."""
        return self._announcer.take() if self._announcer is not None else None

    def take_stats(self) -> KVTierStats | None:
        """Counters since the last call."""
        return self.counters.take()

    def take_report(self) -> KVTierWorkerMeta | None:
        """Loads finished in the step, measurements and changes since the last call, for the
        scheduler side (None when there is nothing to tell)."""
        with self._lock:
            report, self._report = self._report, KVTierWorkerMeta()
        epoch = self.cache.epoch
        report.changed, self._reported_epoch = epoch != self._reported_epoch, epoch
        return report or None

    def close(self) -> None:
        """Finish loads and queued stores, close the tiers."""
        self._pool.shutdown(wait=True)
        self._sync_pool.shutdown(wait=True)
        self._save_pool.shutdown(wait=True)
        if self.engine is not None:
            self.engine.close()
        close_cache(self.cache)


def straight_tier(tiers: Sequence[Any]) -> tuple[int, Any] | None:
    """The first tier that reads straight into the engine's memory (``file://…&gds=1``), with
    its index: loads it holds skip host memory."""
    for i, tier in enumerate(tiers):
        if getattr(tier, "device_io", None) is not None:
            return i, tier
    return None


def _part(job: LoadJob, start: int, end: int) -> LoadJob:
    """Chunks ``start:end`` of a load (its tiers with them, when given per chunk)."""
    tiers = job.tiers[start:end] if job.tiers_per_chunk else job.tiers
    return replace(job, chunks=job.chunks[start:end], tiers=tiers)


__all__ = ["WorkerSide", "layer_names"]
