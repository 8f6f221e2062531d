"""What the shared tiers (Redis/Valkey, S3, Mooncake Store) have in common: options, object names,
the block container, the single-block verbs over batched ones, opening a server that may be down,
and bounding the calls of a client library that can block.

A shared tier's capacity belongs to its server (``shared=True, evicts=False``): the server's
memory policy, or a ``ttl=``, bounds what it holds, and a key the server dropped is a miss. It
keeps no index of its own, since other processes write the same keys; every answer comes from
the server. Blocks are stored in the same checksummed container as on every tier, so a foreign,
stale or corrupt object raises a :class:`~kvtier.codec.BlockError` (a counted miss), never data.

An operation that does not answer within ``timeout=`` seconds raises (TimeoutError or the
client's error), so the cache skips the tier for a while (its back-off) instead of waiting.
"""

from __future__ import annotations

import abc
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from kvtier.codec import BlockError, BlockHeader, BlockMeta, unpack_into
from kvtier.codec.container import RAW_META
from kvtier.codec.parallel import Decoders
from kvtier.errors import TierUnavailableError
from kvtier.tiers.base import Tier, TierCapabilities
from kvtier.tiers.url import CODEC_CHOICES, UrlOptions, opt

log = logging.getLogger("kvtier.tiers")
T = TypeVar("T")

#: The default bound of one operation, in seconds (a store on the local network).
DEFAULT_TIMEOUT_S = 0.1


def timeout_option(default: float) -> Any:
    """The ``timeout=`` option with a default that fits the store's real latency."""
    return opt(
        "seconds",
        default,
        min=0.001,
        help="seconds an operation may take, retries included, before it fails (the tier is "
        "then skipped a while)",
    )


@dataclass(frozen=True, kw_only=True)
class SharedOptions(UrlOptions):
    """Options every shared tier has: the operation bound, a TTL, the key prefix, optional, name."""

    timeout: float = timeout_option(DEFAULT_TIMEOUT_S)
    ttl: float = opt("seconds", 0.0, help="seconds a stored block lives (0: as long as kept)")
    prefix: str = opt("str", "kvtier", help="the first part of every object's name")
    optional: bool = opt(
        "switch", False, help="open even when the server does not answer (logged, degraded)"
    )
    name: str | None = opt("str", None, help="the tier's name in stats")
    codec: str = opt(
        "choice", "kv", choices=CODEC_CHOICES, help="how blocks are stored (raw: as they are)"
    )


def object_name(prefix: str, namespace: bytes, key: bytes, sep: str = ":") -> str:
    """The object name of a block: the prefix, the namespace and the key, in hex."""
    return f"{prefix}{sep}{namespace.hex()}{sep}{key.hex()}"


def key_of(name: str) -> bytes | None:
    """The block key at the end of an object name (None for a name that is not one)."""
    tail = name.rstrip("}")[-32:]
    try:
        key = bytes.fromhex(tail)
    except ValueError:
        return None
    return key if len(key) == 16 else None


def decode(namespace: bytes, key: bytes, data, out) -> BlockHeader:
    """Check a stored object and decode it into ``out`` (BlockError when it is not this block)."""
    return unpack_into(data, out, namespace, key)


class SharedTier(Tier):
    """A tier on a server other processes use too; subclasses give the batched verbs. The
    server keeps the blocks and owns their capacity (it evicts, not the tier)."""

    capabilities = TierCapabilities(persistent=True, shared=True, evicts=False)

    def contains(self, key: bytes) -> bool:
        return self.contains_many([key])[0]

    def get_into(self, key: bytes, out) -> BlockHeader | None:
        result = self.get_many_into([key], [out])[0]
        if isinstance(result, BlockError):
            raise result
        return result

    def put(self, key: bytes, payload, meta: BlockMeta = RAW_META) -> bool:
        return self.put_many([(key, payload, meta)])[0]

    def get_many_into(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        if len(keys) != len(outs):
            raise ValueError("get_many_into needs one buffer per key")
        return self._get_many(keys, outs) if keys else []

    @abc.abstractmethod
    def _get_many(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        """:meth:`get_many_into` of a non-empty batch with one buffer per key."""

    def delete(self, key: bytes) -> bool:
        return self.delete_many([key])[0]

    @functools.cached_property
    def _decoders(self) -> Decoders:
        """The threads a batch's coded blocks decode on (every core)."""
        return Decoders()

    def _encode_all(self, pack: Callable[..., T], items: Sequence[tuple]) -> list[T]:
        """``pack(*item)`` for each block of a batch (its stored form), coded ones on every
        core."""
        if self.codec == "raw":
            return [pack(*item) for item in items]
        return self._decoders.map(pack, items)

    def _decode_all(
        self, keys: Sequence[bytes], values: Sequence, outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        """:meth:`_decode_into` for each block of a batch, coded ones on every core."""
        items = list(zip(keys, values, outs, strict=True))
        if self.codec == "raw":
            return [self._decode_into(*item) for item in items]
        return self._decoders.map(self._decode_into, items)

    def _decode_into(
        self, key: bytes, data, out
    ) -> BlockHeader | BlockError | None:  # BufferTooSmallError raises
        if data is None:
            return None
        try:
            return decode(self.namespace, key, data, out)
        except BlockError as exc:
            return exc


def open_or_degrade(what: str, optional: bool, check: Callable[[], None]) -> str | None:
    """Run ``check`` (which raises TierUnavailableError); with ``optional``, log and go on.

    Returns the reason the tier is degraded, or None when it answered.
    """
    try:
        check()
    except TierUnavailableError as exc:
        if not optional:
            raise
        log.warning("kvtier: %s is degraded (optional=1): %s", what, exc)
        return str(exc)
    return None


@dataclass
class _CallFlags:
    """Whether a bounded call has returned, and whether its caller gave up on it first."""

    done: bool = False
    late: bool = False


class BoundedCalls:
    """Blocking calls of a client library, each on a thread of the tier's own, each bounded.

    A caller waits at most the deadline it gives, then gets TimeoutError while the call goes on
    (or hangs) on its thread: a server that accepts and never answers costs the caller its
    bound, never more. While every thread holds such an overdue call, a new call fails at once
    instead of queueing behind them. ``on_drop`` runs in the caller when its call never started
    (what the call would have released).
    """

    def __init__(self, name: str, threads: int):
        self.name = name
        self._threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"kvtier-{name}")
        self._lock = threading.Lock()
        self._overdue = 0

    @property
    def overdue(self) -> int:
        """Calls whose callers gave up on them that have not returned yet."""
        return self._overdue

    def __call__(
        self,
        call: Callable[[], T],
        deadline: float,
        what: str,
        on_drop: Callable[[], None] | None = None,
    ) -> T:
        if self._overdue >= self._threads:
            if on_drop is not None:
                on_drop()
            raise TimeoutError(
                f"{self.name}: {self._overdue} calls still wait for the server; {what} not sent"
            )
        flags = _CallFlags()

        def run() -> T:
            try:
                return call()
            finally:
                with self._lock:
                    flags.done = True
                    if flags.late:
                        self._overdue -= 1

        future = self._pool.submit(run)
        try:
            return future.result(deadline)
        except FutureTimeout:
            if future.cancel():
                if on_drop is not None:
                    on_drop()
            else:
                with self._lock:
                    if not flags.done:
                        flags.late = True
                        self._overdue += 1
            raise TimeoutError(f"{self.name}: {what} took over {deadline:.3f} s") from None

    def close(self) -> None:
        """Stop taking calls; calls still running finish on their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def join(self) -> None:
        """Wait for every call still running (overdue ones included)."""
        self._pool.shutdown(wait=True)


def byte_windows(
    sizes: Sequence[int], window: int, most: int | None = None
) -> list[tuple[int, int]]:
    """``[start, end)`` runs of consecutive items whose sizes add up to at most ``window``
    (at least one item each), and of at most ``most`` items when given."""
    runs: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (total + size > window or (most is not None and i - start >= most)):
            runs.append((start, i))
            start, total = i, 0
        total += size
    if sizes:
        runs.append((start, len(sizes)))
    return runs


def batches(items: Sequence, size: int) -> list[Sequence]:
    """``items`` in runs of at most ``size``."""
    return [items[i : i + size] for i in range(0, len(items), size)]


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "BoundedCalls",
    "SharedOptions",
    "SharedTier",
    "batches",
    "byte_windows",
    "decode",
    "key_of",
    "object_name",
    "open_or_degrade",
    "timeout_option",
]
