"""HuggingFace transformers engine adapter: prefix reuse from a TieredCache around any causal LM.

Per request: token ids → chained chunk keys (namespace built from the model) → ``cache.lookup``
→ a decision (how many leading hit chunks to load; pluggable) → ``cache.load`` into a host
staging buffer → one copy into the KV tensors a ``DynamicCache`` holds as views → prefill of
the remaining tokens only → greedy decode. New full chunks of the prompt are exported from the
cache in a background thread and handed to ``cache.store`` (itself asynchronous).

At least one prompt token is always run through the model (it must produce the logits of the
last position), so at most ``(len(prompt) - 1) // chunk_tokens`` chunks are reused: a prompt
that is entirely cached reloads all but its last chunk and recomputes that one.

**Exact mode** (``exact=True``) prefills in forwards cut at chunk boundaries (chunked prefill,
as vLLM runs it). A chunk's KV is then the same function of its tokens and the chunks before
it whether it is computed now or was computed by an earlier request and reloaded, so logits and
tokens with and without kvtier agree bit for bit. The default runs one forward over the new
tokens (fastest on most hardware): its logits are bit-identical to transformers fed the same
prefix KV, but a prefix computed inside a longer forward can differ in the last bits from the
same prefix computed alone (GEMM blocking depends on the row count), so reuse can move bf16
logits slightly against one full prefill.

An engine serves one request at a time (it reuses its staging buffer); run one per thread.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from packaging.specifiers import SpecifierSet
from transformers import DynamicCache

from kvtier.engines.kv_layout import (
    LAYOUT,
    HostStaging,
    KVBuffer,
    KVLayout,
    chunk_payloads,
    chunks_to_kv,
    kv_to_cache,
    layers_to_chunks,
)
from kvtier.errors import ConfigError, KvtierError
from kvtier.keys import ChunkKeyer, Namespace

DEFAULT_CHUNK_TOKENS = 256


class KVCache(Protocol):
    """What the engine needs of a cache (the TieredCache API)."""

    def lookup(self, keys: Sequence[bytes]) -> Any: ...

    def load(self, keys: Sequence[bytes], outs: Sequence, lookup: Any = None) -> Any: ...

    def store(
        self,
        keys: Sequence[bytes],
        payloads: Sequence,
        meta: Any,
        copy: bool = True,
        values: Sequence[float] | None = None,
    ) -> int: ...

    def flush(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True)
class ReuseQuery:
    """What a decision sees: the prompt, and where its leading chunks are cached.

    ``usable_chunks`` is the hit prefix capped so that one prompt token is left to compute;
    ``tier_names[i]`` serves chunk ``i`` (one name per hit chunk).
    """

    prompt_tokens: int
    chunk_tokens: int
    hit_chunks: int
    usable_chunks: int
    tier_names: tuple[str, ...]
    kv_bytes_per_token: int


#: Returns how many leading chunks to load (clamped to 0 … ``usable_chunks``).
ReuseDecision = Callable[[ReuseQuery], int]


def load_all(query: ReuseQuery) -> int:
    """Load every usable hit chunk."""
    return query.usable_chunks


def recompute_all(query: ReuseQuery) -> int:
    """Load nothing: recompute the whole prompt (the cache still receives its chunks)."""
    return 0


def from_policy(policy) -> ReuseDecision:
    """A decision from an object with ``decide(prompt_tokens, hit_tiers) -> .load_chunks``.

    E.g. :class:`kvtier.policy.decision.LoadOrRecompute` fed by a calibration profile.
    """

    def decide(query: ReuseQuery) -> int:
        return int(policy.decide(query.prompt_tokens, query.tier_names).load_chunks)

    return decide


@dataclass
class RequestRecord:
    """What happened to one request: reuse, tiers, bytes and the time of each step (seconds).

    ``ttft_s`` runs from the call to the first generated token (keys, lookup, load, prefill and
    sampling); ``tier`` is the slowest tier any reused chunk came from. ``forwards`` lists the
    prefill's forwards as (new tokens, cached tokens, seconds): one, or one per chunk in exact
    mode.
    """

    prompt_tokens: int
    chunk_tokens: int
    hit_chunks: int = 0
    loaded_chunks: int = 0
    reused_tokens: int = 0
    computed_tokens: int = 0
    tier: str | None = None
    per_tier: dict[str, int] = field(default_factory=dict)
    load_bytes: int = 0
    lookup_s: float = 0.0
    load_s: float = 0.0
    prefill_s: float = 0.0
    first_token_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    new_tokens: int = 0
    stored_chunks: int = 0
    forwards: list[tuple[int, int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-friendly)."""
        from dataclasses import asdict

        return asdict(self)


@dataclass
class PrefillResult:
    """The prompt's KV cache, the logits of its last position, and the request record."""

    cache: Any
    logits: torch.Tensor
    record: RequestRecord
    stored: Future | None = None


@dataclass
class GenerationResult:
    """Greedy tokens, the prefill logits of the last prompt position, and the request record."""

    tokens: list[int]
    logits: torch.Tensor
    record: RequestRecord
    stored: Future | None = None


def model_namespace(
    model, model_id: str, fingerprint: str, *, tenant: str = "", tp_rank: int = 0, tp_size: int = 1
) -> Namespace:
    """The cache namespace of a model's KV: id, weights fingerprint, KV dtype and geometry."""
    identity = KVLayout.from_model(model).identity(model_id, fingerprint)
    return Namespace.of(identity, layout=LAYOUT, tp_rank=tp_rank, tp_size=tp_size, tenant=tenant)


class UnsupportedCacheError(KvtierError):
    """This transformers version does not take the KV cache the way kvtier hands it over: KV
    reuse would silently compute without the prefix, so the engine refuses instead."""


def forward_keywords(model) -> tuple[str, bool]:
    """(name of the forward's cache argument, whether it takes ``logits_to_keep``).

    Newer transformers name it ``cache``, older ones ``past_key_values``; a forward that names
    neither is refused (:class:`UnsupportedCacheError`) rather than run without its prefix.
    """
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name, "logits_to_keep" in params
    raise UnsupportedCacheError(
        f"{type(model).__name__}.forward takes neither cache= nor past_key_values= "
        f"(transformers {_transformers_version()}); kvtier cannot hand it a KV prefix"
    )


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


#: The transformers releases whose KV cache hand-over the HF engine is tested with (the range
#: includes the one vLLM's CPU build needs); the ``hf`` extra asks for the same.
SUPPORTED_TRANSFORMERS = ">=5.16.1,<5.25"


def check_transformers(version: str | None = None) -> None:
    """Refuse KV reuse on a transformers release outside :data:`SUPPORTED_TRANSFORMERS`
    (``version``: the installed one by default): a cache hand-over that changed could make the
    model compute without its prefix, so the engine stops instead."""
    from packaging.version import InvalidVersion, Version

    found = version or _transformers_version()
    try:
        ok = SpecifierSet(SUPPORTED_TRANSFORMERS).contains(Version(found), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise UnsupportedCacheError(
            f"transformers {found} is outside the range kvtier's HF engine supports "
            f"({SUPPORTED_TRANSFORMERS}); install a release in it (pip install -e '.[hf]') "
            "or run the engine without a cache"
        )


def _as_ids(token_ids) -> torch.Tensor:
    ids = torch.as_tensor(token_ids).to("cpu", torch.long).reshape(-1)
    if ids.numel() == 0:
        raise ConfigError("the prompt is empty; give at least one token id")
    return ids


class HFEngine:
    """Runs an HF causal LM with prefix KV reuse through ``cache`` (None: no kvtier at all).

    ``namespace`` defaults to :func:`model_namespace` of (``model_id``, ``fingerprint``); the
    cache's tiers must have been opened for ``namespace.id``. ``chunk_tokens`` defaults to the
    cache's ``config.chunk_tokens``. ``decide`` picks how many hit chunks to load.
    ``chunk_value(i)`` gives the seconds of prefill chunk ``i`` saves (e.g. from the cost model);
    it is asked when the request's prefill ends, and stored blocks carry it for cost-aware
    eviction. ``exact`` selects chunk-aligned prefill (see the module docstring).
    """

    def __init__(
        self,
        model,
        cache: KVCache | None = None,
        *,
        namespace: Namespace | None = None,
        model_id: str | None = None,
        fingerprint: str | None = None,
        chunk_tokens: int | None = None,
        decide: ReuseDecision = load_all,
        store: bool = True,
        device: str | torch.device | None = None,
        chunk_value: Callable[[int], float] | None = None,
        exact: bool = False,
    ):
        self.model = model
        self.cache = cache
        self.layout = KVLayout.from_model(model)
        if namespace is None:
            if not (model_id and fingerprint):
                raise ConfigError(
                    "HFEngine needs a namespace, or a model_id and weights fingerprint "
                    "(load_model() gives both)"
                )
            namespace = model_namespace(model, model_id, fingerprint)
        self._check_namespace(namespace, cache)
        if cache is not None:
            check_transformers()
        self.namespace = namespace
        cfg_chunk = getattr(getattr(cache, "config", None), "chunk_tokens", None)
        self.chunk_tokens = int(chunk_tokens or cfg_chunk or DEFAULT_CHUNK_TOKENS)
        self.keyer = ChunkKeyer(namespace, self.chunk_tokens)
        self.decide = decide
        self.store_enabled = store
        self.chunk_value = chunk_value
        self.exact = bool(exact)
        self.device = torch.device(device) if device is not None else model.device
        self.meta = self.layout.meta(self.chunk_tokens)
        self._staging = HostStaging(self.layout, self.chunk_tokens)
        self._kv_buffer = KVBuffer(self.layout, self.chunk_tokens, self.device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._cache_kw, self._keep_kw = forward_keywords(model)
        self._exporter: ThreadPoolExecutor | None = None
        self._pending: set[Future] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_loaded(cls, loaded, cache: KVCache | None = None, **kw) -> HFEngine:
        """An engine for a :class:`~kvtier.engines.embedded.LoadedModel`."""
        return cls(
            loaded.model, cache, model_id=loaded.model_id, fingerprint=loaded.fingerprint, **kw
        )

    @staticmethod
    def _check_namespace(namespace: Namespace, cache) -> None:
        for tier in getattr(cache, "tiers", ()) or ():
            ns = getattr(tier, "namespace", None)
            if isinstance(ns, bytes) and ns != namespace.id:
                raise ConfigError(
                    f"tier {getattr(tier, 'name', tier)!r} was opened for another namespace; "
                    "open the tiers with this model's namespace id (model_namespace(...).id)"
                )

    # --- one forward -------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, cache) -> torch.Tensor:
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if self._keep_kw:
            kwargs["logits_to_keep"] = 1
        before = cache.get_seq_length()
        out = self.model(ids.to(self.device).unsqueeze(0), **kwargs)
        if cache.get_seq_length() != before + ids.numel():  # the model ignored our cache
            raise UnsupportedCacheError(
                f"transformers {_transformers_version()} ignored the {self._cache_kw}= "
                "argument (the KV cache did not grow): this version is not supported"
            )
        return out.logits[0, -1]

    def _prefill_forward(
        self, ids: torch.Tensor, cache, cached: int, record: RequestRecord
    ) -> torch.Tensor:
        """Run the new tokens (``cached`` already in ``cache``); logits of the last one."""
        n = ids.numel()
        if not self.exact:
            start = time.perf_counter()
            logits = self._forward(ids, cache)
            record.forwards.append((n, cached, time.perf_counter() - start))
            return logits
        c, pos = self.chunk_tokens, 0
        while True:
            end = min(n, ((cached + pos) // c + 1) * c - cached)
            start = time.perf_counter()
            logits = self._forward(ids[pos:end], cache)
            if self.device.type == "cuda":  # each forward's own time, for the cost model
                torch.cuda.synchronize(self.device)
            record.forwards.append((end - pos, cached + pos, time.perf_counter() - start))
            pos = end
            if pos >= n:
                return logits

    # --- requests ----------------------------------------------------------------------
    def keys(self, token_ids) -> list[bytes]:
        """Keys of the full chunks of ``token_ids`` in this engine's namespace."""
        return self.keyer.keys(_as_ids(token_ids).numpy())

    def lookup_hits(self, token_ids) -> int:
        """Leading full chunks of ``token_ids`` the cache holds now (0 without a cache)."""
        if self.cache is None:
            return 0
        keys = self.keys(token_ids)
        return int(self.cache.lookup(keys).hit_chunks) if keys else 0

    def prefill(self, token_ids) -> PrefillResult:
        """Bring the prompt's KV into a DynamicCache, reusing cached chunks; logits of its end."""
        start = time.perf_counter()
        ids = _as_ids(token_ids)
        n = ids.numel()
        c = self.chunk_tokens
        record = RequestRecord(prompt_tokens=n, chunk_tokens=c)
        keys = self.keyer.keys(ids.numpy()) if self.cache is not None else []
        usable = min(len(keys), (n - 1) // c)
        kv_cache = None
        hit = 0
        with torch.inference_mode():
            if self.cache is not None and usable:
                found = self.cache.lookup(keys[:usable])
                hit = found.hit_chunks
                record.hit_chunks = hit
                names = tuple(found.tier_names)
                t_lookup = time.perf_counter()
                record.lookup_s = t_lookup - start
                query = ReuseQuery(n, c, hit, min(hit, usable), names, self.layout.bytes_per_token)
                want = max(0, min(int(self.decide(query)) if hit else 0, query.usable_chunks))
                if want:
                    kv_cache = self._load(keys[:want], found, record)
                record.load_s = time.perf_counter() - t_lookup
            elif self.cache is not None:
                record.lookup_s = time.perf_counter() - start
            reused = record.loaded_chunks * c
            t0 = time.perf_counter()
            if kv_cache is None:
                kv_cache = DynamicCache(config=self.model.config)
            logits = self._prefill_forward(ids[reused:], kv_cache, reused, record)
            t1 = time.perf_counter()
        record.reused_tokens = reused
        record.computed_tokens = n - reused
        record.prefill_s = t1 - t0
        stored = None
        if self.cache is not None and self.store_enabled and len(keys) > hit:
            stored = self._store_async(kv_cache, keys, hit, record)
        record.ttft_s = time.perf_counter() - start  # completed by generate()
        return PrefillResult(kv_cache, logits, record, stored)

    def _load(self, keys: list[bytes], found, record: RequestRecord):
        outs = self._staging.outs(len(keys))
        result = self.cache.load(keys, outs, lookup=found)
        got = int(result.loaded)
        record.loaded_chunks = got
        record.load_bytes = int(result.bytes)
        record.per_tier = dict(result.per_tier)
        if not got:
            return None
        tiers = list(getattr(result, "tiers", []) or found.tiers[:got])
        if tiers:
            record.tier = found.names[max(tiers)]
        dest = self._kv_buffer.take(got)
        kv = chunks_to_kv(self._staging.chunks(got), self.device, self._stream, out=dest)
        return kv_to_cache(kv, self.model.config)

    def _store_async(self, kv_cache, keys: list[bytes], first: int, record: RequestRecord):
        end = len(keys)
        record.stored_chunks = end - first
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        # The layers' tensors are never changed in place (updates concatenate into new ones),
        # so holding these references is enough to export them later.
        snapshot = [(layer.keys, layer.values) for layer in kv_cache.layers]
        values = None
        if self.chunk_value is not None:
            values = [float(self.chunk_value(i)) for i in range(first, end)]
        with self._lock:
            if self._exporter is None:
                self._exporter = ThreadPoolExecutor(1, thread_name_prefix="kvtier-export")
            future = self._exporter.submit(
                self._export, snapshot, keys[first:end], first, event, values
            )
            self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    def _export(self, snapshot, keys: list[bytes], first: int, event, values) -> int:
        with torch.inference_mode():
            if event is not None:
                event.synchronize()
            chunks = layers_to_chunks(
                snapshot, self.layout, self.chunk_tokens, first, first + len(keys)
            )
            return self.cache.store(
                keys, chunk_payloads(chunks), self.meta, copy=False, values=values
            )

    def generate(
        self, token_ids, max_new_tokens: int = 16, eos_token_id: int | None = None
    ) -> GenerationResult:
        """Greedy generation: prefill (with reuse), then ``max_new_tokens`` decode steps."""
        start = time.perf_counter()
        pre = self.prefill(token_ids)
        record = pre.record
        t0 = time.perf_counter()
        token = int(torch.argmax(pre.logits))
        t1 = time.perf_counter()
        record.first_token_s = t1 - t0
        record.ttft_s = t1 - start
        tokens = [token]
        with torch.inference_mode():
            while len(tokens) < max_new_tokens and token != eos_token_id:
                logits = self._forward(torch.tensor([token]), pre.cache)
                token = int(torch.argmax(logits))
                tokens.append(token)
        record.decode_s = time.perf_counter() - t1
        record.new_tokens = len(tokens)
        return GenerationResult(tokens, pre.logits, record, pre.stored)

    # --- life cycle --------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait for pending chunk exports and the cache's queued writes; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for future in list(self._pending):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                future.result(left)
            except TimeoutError:
                return False
        if self.cache is None:
            return True
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return bool(self.cache.flush(left))

    def close(self) -> None:
        """Finish pending exports and stop the export thread (the cache stays open)."""
        with self._lock:
            exporter, self._exporter = self._exporter, None
        if exporter is not None:
            exporter.shutdown(wait=True)

    def __enter__(self) -> HFEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
