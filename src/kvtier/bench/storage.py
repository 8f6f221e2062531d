"""``kvtier bench storage``: write then read KV-shaped blocks through each tier and a reference.

For every tier and every depth: a write pass (``put_many``) of fresh blocks, a read pass
(``get_many_into``) of the same blocks, then the same pattern through the reference: fio in the
disk tier's directory with one file per block of the tier's block-file size (for a slab tier:
one preallocated file of such blocks), at the same depth, engine, O_DIRECT and O_DSYNC as the
tier; or plain copies between preallocated buffers for the memory tier. Rates are decimal GB/s
of payload.

Depth is reached the way the cache would reach it: a tier with its own parallel I/O (the disk
tier's ``depth=`` backend) is reopened at each depth and fed by one caller in requests of
several blocks (``native``); other tiers get that many caller threads (``threads``). Both sides
start warm: one untimed write pass per tier (and per fio file set) first, so timed writes reuse
allocated memory and files, as a long-running cache does.

A shared disk's speed drifts by tens of percent within seconds, so a disk pass is cut into up
to ``slices`` slices (each a full round of requests at the depth or more) and kvtier and fio
take turns slice by slice, who goes first alternating: both sides then see the same device
state. A pass's figures are the sums of its slices'. Memory passes are not cut.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import xxhash

from kvtier.bench.clients import ClientReference, client_reference
from kvtier.bench.driver import PassPlan, run_pass
from kvtier.bench.env import BenchEnvironment, drop_caches
from kvtier.bench.fio import FioError, FioJob, fio_binary, fio_version, run_fio
from kvtier.bench.reference import CopyReference, WorkerBuffers, aligned_empty
from kvtier.bench.results import (
    TARGET_MIN_BLOCK,
    Measurement,
    Reference,
    StorageReport,
)
from kvtier.bench.stats import PassResult, combine_passes, median_pass
from kvtier.bench.storage_config import (  # noqa: F401 - the config is named from here too
    DEFAULT_DATA,
    KV_PAYLOAD_MODEL,
    PAYLOAD_KINDS,
    RAW_TWIN,
    REFERENCE_KINDS,
    StorageBenchConfig,
    url_codec,
)
from kvtier.codec import BlockHeader
from kvtier.codec.container import HEADER_SIZE
from kvtier.errors import ConfigError, KvtierError
from kvtier.keys import Namespace
from kvtier.specs import MiB, format_bytes
from kvtier.tiers import Tier, TierURL, open_tier
from kvtier.tiers.files.base import FileTier, IOProfile
from kvtier.tiers.registry import DIRECTORY_SCHEMES

StepCallback = Callable[[str], None]
PAGE = 4096
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs")
PAYLOADS = 8  # distinct payloads per pass
TWIN_DETAIL = "the same tier with codec=raw, same blocks, taking turns slice by slice"
#: Added for disk tiers, which swap places with their twin between repeats.
SWAP_DETAIL = ", the two swapping files every repeat"
NATIVE_REQUEST_BYTES = 256 * MiB
NATIVE_REQUEST_TOKENS = 32768


def native_request_blocks(depth: int, block_bytes: int, chunk_tokens: int = 256) -> int:
    """Blocks per request of a native drive: the chunks of a 32k-token prefix (what the cache
    asks a tier for at once when a long-context request loads its prefix), at most ~256 MiB,
    a whole number of rounds at the depth, at least one round."""
    want = -(-NATIVE_REQUEST_TOKENS // max(1, chunk_tokens))
    blocks = min(want, max(1, NATIVE_REQUEST_BYTES // max(1, block_bytes)))
    return max(depth, blocks // depth * depth)


class BenchError(KvtierError):
    """A benchmark pass went wrong (lost blocks, tier refused writes)."""


@contextlib.contextmanager
def _tier_errors(what: str, op: str, depth: int) -> Iterator[None]:
    """A tier (or its server) failing inside a pass ends the bench with one line."""
    try:
        yield
    except KvtierError:
        raise
    except Exception as exc:
        brief = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise BenchError(
            f"{what} failed in the {op} pass at depth {depth} ({type(exc).__name__}: {brief}); "
            "a server slower than the tier's timeout= under this load needs a larger one "
            "(e.g. ?timeout=2), or lower --depth"
        ) from None


# --- tier-specific knowledge -------------------------------------------------------------------


def disk_io_profile(tier: Tier) -> IOProfile | None:
    """The I/O profile a file tier declares (None for other media): fio does the same."""
    return tier.io_profile if isinstance(tier, FileTier) else None


def native_depth(tier: Tier) -> int | None:
    """The tier's own I/O depth when it runs batches in parallel itself (disk tier ``depth=``)."""
    profile = disk_io_profile(tier)
    return profile.depth if profile is not None else None


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with option ``name`` set to ``value`` (validated through the tier's options)."""
    from kvtier.tiers.registry import replace_options

    return replace_options(url, **{name: value})


def default_tier_urls(directory: Path | None = None, data_size: int = DEFAULT_DATA) -> list[str]:
    """memory plus a ``slab://`` disk tier (in ``./.kvtier/bench`` unless given), each sized
    for the data."""
    directory = (directory or Path.cwd() / ".kvtier" / "bench").resolve()
    size_mib = max(1024, math.ceil(2 * data_size / MiB))
    return [f"memory://?size={size_mib}MiB", f"slab://{directory}?size={size_mib}MiB"]


# --- the run -----------------------------------------------------------------------------------


@dataclass
class _TierRun:
    """One tier under test: its URL and namespace, the open tier (reopened per depth when
    native), refs."""

    url: str
    namespace: bytes
    tier: Tier
    native: bool
    profile: IOProfile | None
    pool: list[np.ndarray] = field(default_factory=list)
    copy_ref: CopyReference | ClientReference | None = None
    twin: _TierRun | None = None  # the same tier with codec=raw (``--reference raw``)

    def opened(self) -> tuple[_TierRun, ...]:
        """This run and its twin (if any): the tiers open for it."""
        return (self,) if self.twin is None else (self, self.twin)

    def reopen(self, depth: int | None) -> None:
        """Reopen every tier of the run (at I/O depth ``depth`` when given); all are closed
        first, so their files are free for whichever tier opens them next."""
        for each in self.opened():
            each.tier.close()
        for each in self.opened():
            url = each.url if depth is None else with_option(each.url, "depth", str(depth))
            each.tier = open_tier(url, each.namespace)

    @property
    def swaps(self) -> bool:
        """Whether this tier and its twin swap places between repeats: disk tiers, whose
        files lie where the filesystem put them, and a disk is not as fast everywhere."""
        return self.twin is not None and self.profile is not None

    @property
    def twin_detail(self) -> str:
        """How this tier is compared with its twin, for the notes and every reference pass."""
        return TWIN_DETAIL + (SWAP_DETAIL if self.swaps else "")

    def swap_places(self, depth: int | None) -> None:
        """Swap the namespaces, hence the files, of this tier and its twin, and reopen both:
        each adopts the files the other wrote (closed cleanly), so over the repeats both
        sides write and read the same places on the disk equally often."""
        twin = self.twin
        assert twin is not None
        self.namespace, twin.namespace = twin.namespace, self.namespace
        self.reopen(depth)


def _median_reference(refs: Sequence[Reference]) -> Reference | None:
    """The reference pass of median bandwidth, carrying every repeat's rate."""
    if not refs:
        return None
    mid = median_pass([x.result for x in refs])
    ref = next(x for x in refs if x.result is mid)
    return replace(ref, samples_gbps=tuple(x.result.gbps for x in refs))


class StorageBench:
    """Runs the storage benchmark described by a config; ``on_step`` hears each finished step."""

    def __init__(self, config: StorageBenchConfig, on_step: StepCallback | None = None):
        self.config = config
        self.on_step = on_step or (lambda _label: None)
        self.namespace = Namespace.for_model(config.spec, "kvtier-bench")
        # the raw twins' blocks live apart from the tiers' own, in the same places
        self.twin_namespace = Namespace.for_model(config.spec, "kvtier-bench-raw-twin")
        self.fio = fio_binary() if config.fio else None
        self._nonce = os.urandom(8)
        self._kv: list[np.ndarray] | None = None

    def steps(self) -> int:
        """Steps ``run`` reports: a warm-up per tier, 3 per tier, depth and repeat, the lookup."""
        cfg = self.config
        return len(cfg.tiers) * (1 + 3 * len(cfg.depths) * cfg.repeats) + int(cfg.lookup)

    def run(self) -> StorageReport:
        """Measure every tier at every depth, then the lookup."""
        cfg = self.config
        disk_dir = next(
            (
                Path(TierURL.parse(u).path)
                for u in cfg.tiers
                if TierURL.parse(u).scheme in DIRECTORY_SCHEMES
            ),
            None,
        )
        env = BenchEnvironment.probe(disk_dir, fio_version(self.fio) if self.fio else None)
        report = StorageReport(cfg, env)
        try:
            for url in cfg.tiers:
                report.measurements += self._bench_url(url, report)
            if cfg.lookup:
                self._lookup(report)
                self.on_step("lookup")
        finally:
            self._cleanup()
        self._general_notes(report)
        return report

    def _cleanup(self) -> None:
        """Remove what the bench left in file tiers: its own namespace folder, nothing else."""
        for url in self.config.tiers:
            parsed = TierURL.parse(url)
            if parsed.scheme in DIRECTORY_SCHEMES and parsed.path:
                for ns in (self.namespace, self.twin_namespace):
                    shutil.rmtree(Path(parsed.path) / ns.id.hex(), ignore_errors=True)

    # --- one tier ---------------------------------------------------------------------------
    def _bench_url(self, url: str, report: StorageReport) -> list[Measurement]:
        cfg = self.config
        block, items = cfg.block_bytes, cfg.blocks
        tier = open_tier(url, self.namespace.id)
        native = cfg.drive == "native" or (cfg.drive == "auto" and native_depth(tier) is not None)
        if native and native_depth(tier) is None:
            tier.close()
            raise ConfigError(f"tier {url} has no I/O depth of its own; use --drive threads")
        if native and "depth" in TierURL.parse(url).options:
            report.notes.append(f"{tier.name}: the depth= option of {url} is replaced by --depth")
        run = _TierRun(url, self.namespace.id, tier, native, disk_io_profile(tier))
        self._tier_notes(tier, run.profile, report)
        rows: list[Measurement] = []
        try:
            self._check_capacity(url, tier, items, block, run.profile)
            run.pool = self._payload_pool(items)
            if cfg.reference == RAW_TWIN:
                twin_url, ns = with_option(url, "codec", "raw"), self.twin_namespace.id
                twin = open_tier(twin_url, ns)
                run.twin = _TierRun(twin_url, ns, twin, native, disk_io_profile(twin), run.pool)
                self._check_capacity(twin_url, twin, items, block, run.twin.profile)
            # warm-up: map the tier's memory / create its files once, untimed
            self._warm(run, items, max(cfg.depths))
            if run.twin is not None:
                report.notes.append(
                    f"{tier.name}: compared with {run.twin.url} ({run.twin_detail})"
                )
            elif tier.scheme == "memory":
                run.copy_ref = CopyReference(items, block)
            else:
                run.copy_ref = client_reference(tier, items, block)
            self.on_step(f"{tier.name}: warm-up")
            for depth in cfg.depths:
                if native:
                    run.reopen(depth)
                rows += self._measure_depth(run, depth, report)
        finally:
            if run.copy_ref is not None:
                run.copy_ref.close()
            for each in run.opened():
                each.tier.close()
        return rows

    def _measure_depth(self, run: _TierRun, depth: int, report: StorageReport) -> list[Measurement]:
        """``repeats`` rounds of kvtier and the reference, interleaved slice by slice; the
        median round of each."""
        cfg = self.config
        block, items, tier = cfg.block_bytes, cfg.blocks, run.tier
        if run.native:
            request = min(items, cfg.batch or native_request_blocks(depth, block, cfg.chunk_tokens))
            unit, threads = request, 1
            # whole requests: a pass that does not divide into them would cut each one short
            items = max(unit, items // unit * unit)
        else:
            request = min(items, cfg.batch or 1)
            unit, threads = request * depth, depth
        slices = self._slices(items, unit if run.copy_ref is None else items)
        fio_jobs: list[FioJob] = []
        if (
            run.copy_ref is None
            and run.twin is None
            and run.profile is not None
            and self.fio is not None
        ):
            engine = run.profile.ioengine if run.native else "psync"
            fio_jobs = self._fio_layout(run.profile, engine, depth, slices, report)
        # one slice reads for at least min_read_seconds; slices read their share once
        min_read = cfg.min_read_seconds if len(slices) == 1 else 0.0
        runs: dict[str, list[PassResult]] = {"write": [], "read": []}
        ref_runs: dict[str, list[Reference]] = {"write": [], "read": []}
        try:
            for r in range(cfg.repeats):
                label = f"{tier.name} depth {depth}" + (f" #{r + 1}" if cfg.repeats > 1 else "")
                if r and run.swaps:
                    run.swap_places(depth if run.native else None)
                    self._warm(run, unit, depth)
                    tier = run.tier
                keys = self._keys(run.url, depth * 1000 + r + 1, items)
                ours: dict[str, list[PassResult]] = {"write": [], "read": []}
                theirs: dict[str, list[Reference]] = {"write": [], "read": []}
                for op in ("write", "read"):
                    for k, (a, b) in enumerate(slices):
                        # a slice's requests are even: no short request at its end
                        per = -(-(b - a) // -(-(b - a) // request))
                        plan = PassPlan(b - a, block, threads, per, 0.0)
                        if op == "read":
                            plan = replace(plan, min_seconds=min_read)

                        # alternate who goes first: what one side leaves behind (dirty caches,
                        # a busy device) then hits both, and both see the same device state
                        order = ("kvtier", "reference")
                        for side in order if (r + k) % 2 == 0 else order[::-1]:
                            if side == "kvtier":
                                ours[op].append(self._tier_pass(run, op, keys[a:b], plan))
                                continue
                            if run.twin is not None:
                                twin = self._tier_pass(run.twin, op, keys[a:b], plan)
                                theirs[op].append(Reference(RAW_TWIN, twin, run.twin_detail))
                                continue
                            ref = self._reference_pass(run, op, plan, fio_jobs, k, ours, report)
                            if ref is not None:
                                theirs[op].append(ref)
                    self.on_step(f"{label}: {op}s")
                with _tier_errors(tier.name, "clean-up", depth):
                    for each in run.opened():
                        each.tier.delete_many(keys)
                    if isinstance(run.copy_ref, ClientReference):
                        run.copy_ref.forget()
                for op in ("write", "read"):
                    runs[op].append(combine_passes(ours[op]))
                    if theirs[op] and len(theirs[op]) == len(slices):
                        ref0 = theirs[op][0]
                        detail = ref0.detail + (
                            f" (one of {len(slices)} slices)" if len(slices) > 1 else ""
                        )
                        combined = combine_passes([x.result for x in theirs[op]])
                        ref_runs[op].append(Reference(ref0.kind, combined, detail))
                self.on_step(f"{label}: done")
        finally:
            for job in fio_jobs:
                job.remove_files()
        return [
            Measurement(
                tier=tier.name,
                url=run.url,
                scheme=tier.scheme,
                op=op,
                depth=depth,
                drive="native" if run.native else "threads",
                request_blocks=request,
                block_bytes=block,
                chunk_tokens=cfg.chunk_tokens,
                result=median_pass(runs[op]),
                reference=_median_reference(ref_runs[op]),
                samples_gbps=tuple(x.gbps for x in runs[op]),
                slices=len(slices),
                payload=cfg.payload,
            )
            for op in ("write", "read")
        ]

    def _warm(self, run: _TierRun, items: int, depth: int) -> None:
        """Write and delete ``items`` blocks through each tier of ``run``, untimed: its memory
        mapped, its files made, its rings' staging faulted in."""
        warm = self._keys(run.url, 0, items)
        plan = PassPlan(items, self.config.block_bytes, depth, 1)
        for each in run.opened():
            with _tier_errors(each.tier.name, "warm-up", depth):
                self._write(each.tier, warm, plan, run.pool)
                each.tier.delete_many(warm)

    def _slices(self, items: int, unit: int) -> list[tuple[int, int]]:
        """``[start, end)`` ranges cutting a pass into up to ``config.slices`` parts of whole
        ``unit`` items (one full round of requests at the depth); the last part takes what
        is left over."""
        unit = max(1, unit)
        units = max(1, items // unit)
        count = min(self.config.slices, units)
        bounds = [k * units // count * unit for k in range(count)] + [items]
        return list(itertools.pairwise(bounds))

    def _tier_pass(self, run: _TierRun, op: str, keys: Sequence[bytes], plan: PassPlan):
        """One timed kvtier pass (``op``) over ``keys``."""
        with _tier_errors(run.tier.name, op, plan.threads):
            if op == "write":
                return self._write(run.tier, keys, plan, run.pool)
            if run.profile and not run.profile.direct:
                drop_caches()
            return self._read(run.tier, keys, plan, run.pool)

    def _reference_pass(
        self,
        run: _TierRun,
        op: str,
        plan: PassPlan,
        fio_jobs: Sequence[FioJob],
        k: int,
        ours: dict[str, list[PassResult]],
        report: StorageReport,
    ) -> Reference | None:
        """The reference for one slice: a plain copy (memory) or fio on slice ``k``'s files."""
        if run.copy_ref is not None:
            do = run.copy_ref.write if op == "write" else run.copy_ref.read
            if isinstance(run.copy_ref, CopyReference):
                detail = f"numpy.copyto of preallocated buffers, {plan.threads} threads"
                return Reference("copy", do(plan), detail)
            with _tier_errors(f"{run.tier.name}'s raw client", op, plan.threads):
                return Reference(run.copy_ref.kind, do(plan), run.copy_ref.detail(plan))
        if not fio_jobs:
            return None
        loops = 1
        if op == "read" and ours["read"] and len(ours["read"]) > k:
            # read as much as kvtier did (a read pass may loop to last min_read_seconds)
            loops = max(1, round(ours["read"][k].bytes / (plan.items * plan.item_bytes)))
        if op == "read" and not fio_jobs[k].direct:
            drop_caches()
        try:
            res = run_fio(replace(fio_jobs[k], op=op, loops=loops), self.fio)
        except FioError as exc:
            report.notes.append(f"fio reference failed at depth {fio_jobs[k].depth}: {exc}")
            return None
        return Reference("fio", res.result, " ".join(res.command[1:]))

    def _payload_pool(self, items: int) -> list[np.ndarray]:
        """A few payloads (random, or real KV chunks); block ``i`` is written from
        ``pool[i % len(pool)]``."""
        rng = np.random.default_rng()
        chunks = self._kv_chunks() if self.config.payload == "kv" else []
        pool = []
        for i in range(min(items, PAYLOADS)):
            buf = aligned_empty(self.config.block_bytes)
            if chunks:
                buf[:] = np.frombuffer(chunks[i % len(chunks)].tobytes(), np.uint8)
            else:
                buf[:] = rng.integers(0, 256, buf.nbytes, dtype=np.uint8)
            pool.append(buf)
        return pool

    def _kv_chunks(self) -> list[np.ndarray]:
        """Real KV chunks of the embedded model, as many kinds and lengths as the pool takes."""
        if self._kv is None:
            from kvtier.engines.kv_corpus import load_corpus

            dtype = self.config.spec.kv_dtype
            corpus = load_corpus(dtypes=(dtype,), lengths=(1024,), per_prompt=2)
            self._kv = [chunk for item in corpus for chunk in item.chunks][:PAYLOADS]
            if not self._kv or self._kv[0].nbytes != self.config.block_bytes:
                raise ConfigError("the KV corpus's chunks are not this model's blocks")
        return self._kv

    def _keys(self, url: str, depth: int, items: int) -> list[bytes]:
        seed = self._nonce + url.encode() + depth.to_bytes(4, "little")
        return [xxhash.xxh3_128_digest(seed + i.to_bytes(8, "little")) for i in range(items)]

    def _check_capacity(
        self, url: str, tier: Tier, items: int, block: int, profile: IOProfile | None
    ) -> None:
        per_block = profile.file_bytes(block) if profile else block + HEADER_SIZE + PAGE
        need = items * per_block
        capacity = tier.usage().capacity_bytes
        if capacity and need > capacity:
            raise ConfigError(
                f"tier {url} holds {format_bytes(capacity)} but one pass writes "
                f"{format_bytes(need)}; raise its size= or lower --data-size"
            )

    def _write(
        self, tier: Tier, keys: Sequence[bytes], plan: PassPlan, pool: list[np.ndarray]
    ) -> PassResult:
        """Time ``put_many`` of every key (payloads are shared, read-only buffers)."""
        meta = self.config.block_meta
        rejected: list[int] = []
        requests = {  # built before the clock starts, like the reference's buffers
            r[0]: [(keys[i], pool[i % len(pool)], meta) for i in r]  # keyed by its first item
            for w in range(plan.threads)
            for r in plan.requests_of(w)
        }

        def work(worker: int, indices: Sequence[int]) -> None:
            ok = tier.put_many(requests[indices[0]])
            if False in ok:
                rejected.extend(i for i, good in zip(indices, ok, strict=True) if not good)

        result = run_pass(plan, work)
        if rejected:
            raise BenchError(
                f"tier {tier.name} refused {len(rejected)} of {plan.items} blocks; "
                "give it more room (size=) or lower --data-size"
            )
        return result

    def _read(
        self, tier: Tier, keys: Sequence[bytes], plan: PassPlan, pool: list[np.ndarray]
    ) -> PassResult:
        """Time ``get_many_into`` of every key into reused aligned buffers; check the bytes.

        Inside the timed requests only what a caller must do anyway happens (the call, and a
        look for misses and errors); key lists are built before the clock starts, and the
        payload bytes of each thread's last request are compared after the pass (the buffers
        are reused, so they then hold exactly those blocks), so the bench's own bookkeeping is
        not charged to the tier (the copy reference does none either).
        """
        outs = WorkerBuffers(plan.item_bytes, plan.batch, fill=0)
        buffers = outs.ensure(plan.threads)
        requests = {  # keyed by the request's first item: (keys, the worker's buffers)
            r[0]: ([keys[i] for i in r], buffers[w][: len(r)])
            for w in range(plan.threads)
            for r in plan.requests_of(w)
        }
        last: list[Sequence[int]] = [()] * plan.threads
        bad: list[str] = []

        def work(worker: int, indices: Sequence[int]) -> None:
            results = tier.get_many_into(*requests[indices[0]])
            last[worker] = indices
            for res in results:
                if type(res) is not BlockHeader:
                    bad.extend(
                        f"block {i}: {res or 'miss'}"
                        for i, res in zip(indices, results, strict=True)
                        if type(res) is not BlockHeader
                    )
                    break

        try:
            result = run_pass(plan, work)
            for worker, indices in enumerate(last):
                for i, buf in zip(indices, buffers[worker], strict=False):
                    want = pool[i % len(pool)]
                    if buf[:16].tobytes() != want[:16].tobytes() or (
                        buf[-16:].tobytes() != want[-16:].tobytes()
                    ):
                        bad.append(f"block {i}: wrong payload")
        finally:
            outs.clear()
        if bad:
            raise BenchError(
                f"tier {tier.name} failed {len(bad)} block reads (first: {bad[0]}); "
                "is it large enough for --data-size?"
            )
        return result

    def _fio_layout(
        self,
        profile: IOProfile,
        engine: str,
        depth: int,
        slices: Sequence[tuple[int, int]],
        report: StorageReport,
    ) -> list[FioJob]:
        """Lay out fio's files per slice, untimed: one file per block, the size of the tier's
        block file (or one file of such blocks for a slab tier), in the tier's folder (the
        tier's timed writes reuse files too). Empty if fio fails."""
        jobs = [
            FioJob(
                directory=profile.directory,
                op="write",
                block_size=profile.file_bytes(self.config.block_bytes),
                blocks=b - a,
                depth=depth,
                ioengine=engine,
                direct=profile.direct,
                filename=f"kvtier-fio-{os.getpid()}-{k}",
                sync="dsync" if profile.sync else "none",
                layout=profile.layout,
            )
            for k, (a, b) in enumerate(slices)
        ]
        try:
            for job in jobs:
                run_fio(job, self.fio)
        except FioError as exc:
            for job in jobs:
                job.remove_files()
            report.notes.append(f"fio reference failed at depth {depth}: {exc}")
            return []
        return jobs

    # --- lookup and notes -------------------------------------------------------------------
    def _lookup(self, report: StorageReport) -> None:
        try:
            from kvtier.bench.lookup import measure_lookup
        except ImportError as exc:
            report.notes.append(f"lookup row skipped: {exc}")
            return
        cfg = self.config
        tiers = [open_tier(url, self.namespace.id) for url in cfg.tiers]
        try:
            report.lookup = measure_lookup(
                tiers, self.namespace, cfg.lookup_chunks, cfg.chunk_tokens, cfg.lookup_repeats
            )
        finally:
            for tier in tiers:
                tier.close()

    def _tier_notes(self, tier: Tier, profile: IOProfile | None, report: StorageReport):
        if profile is None:
            return
        env = report.environment
        if profile.direct:
            note = f"{tier.name}: O_DIRECT, so reads bypass the page cache (no cache drop needed)"
        elif env.can_drop_caches:
            note = f"{tier.name}: buffered I/O; the page cache is dropped before every read pass"
        else:
            note = (
                f"{tier.name}: buffered I/O and no permission to drop the page cache: "
                "reads may come from memory"
            )
        report.notes.append(note)
        if env.filesystem in MEMORY_FILESYSTEMS:
            report.notes.append(
                f"{profile.directory} is on {env.filesystem}, which lives in RAM: the disk rows "
                "measure memory; use --dir (or a file:// tier) on a real disk"
            )
        elif env.o_direct is False:
            report.notes.append(
                f"{profile.directory} ({env.filesystem}) has no O_DIRECT: the tier and fio use "
                "the page cache, dropped before reads only when running as root"
            )
        if self.config.fio and self.fio is None:
            report.notes.append("fio is not installed: no disk reference (apt-get install fio)")

    def _general_notes(self, report: StorageReport) -> None:
        if self.config.block_bytes < TARGET_MIN_BLOCK:
            report.notes.append(
                f"blocks of {format_bytes(self.config.block_bytes)} are below 256 KiB: "
                "ratios are shown without targets"
            )
        if any(m.drive == "native" for m in report.measurements):
            report.notes.append(
                "native rows: one caller, the tier's own I/O depth, latency per request of "
                "several blocks (fio's latency, in the JSON, is per block)"
            )
