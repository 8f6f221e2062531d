"""The Mooncake Store tier: one object per block (``<prefix>:<namespace>:<key>``, hex) in a
Mooncake Store, through its Python client, which lends the store no memory by default (a store
process holds the capacity). Every client call is bounded on the tier's threads, deletes a
reader's lease holds off are retried later, and a restarted master's lost objects are misses;
docs/reference/tiers.md says how and why.
"""

from __future__ import annotations

import ctypes
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from urllib.parse import urlsplit

from mooncake.store import BufferPool, MooncakeDistributedStore

from kvtier.codec import BlockError, BlockHeader, BlockMeta, CorruptBlockError, pack_block
from kvtier.errors import ConfigError, TierUnavailableError
from kvtier.tiers.base import TierURL, TierUsage
from kvtier.tiers.mooncake.options import DEFAULT_ADMIN_PORT, DEFAULT_MASTER_PORT, MooncakeOptions
from kvtier.tiers.shared import (
    BoundedCalls,
    SharedTier,
    batches,
    byte_windows,
    key_of,
    open_or_degrade,
)
from kvtier.tiers.url import parse_options

_THREADS = 8  # calls to the client in flight (the cache's threads, and a few overdue ones)
_SETUP_RETRY_S = 2.0  # between attempts to set the client up while the master is away
_REMOVE_RETRY_S = 1.0  # between attempts to remove objects a reader's lease kept
_LIST_TIMEOUT_S = 5.0  # the admin server's listings
_QUERY_BATCH = 64  # object names per admin query

# Mooncake's error codes (mooncake-store/include/types.h) the tier tells apart.
_NOT_FOUND = -704
_HAS_LEASE = -706
_RPC_ERRORS = {-900: "RPC_FAIL", -901: "RPC_TIMEOUT"}
_FULL = {-10: "BUFFER_OVERFLOW", -200: "NO_AVAILABLE_HANDLE", -714: "OBJECT_REPLICA_BUSY"}


class MooncakeTier(SharedTier):
    """KV blocks as Mooncake Store objects, shared by every client of the same master."""

    scheme = "mooncake"
    Options = MooncakeOptions

    def __init__(
        self,
        namespace: bytes,
        host: str = "127.0.0.1",
        port: int = DEFAULT_MASTER_PORT,
        options: MooncakeOptions | None = None,
    ):
        self.options = o = options or MooncakeOptions()
        super().__init__(namespace, o.name or "mooncake", o.codec)
        self.host, self.port = host, port
        self.master = f"{host}:{port}"
        self.admin = (o.admin or f"http://{host}:{DEFAULT_ADMIN_PORT}").rstrip("/")
        self.refused_puts = 0
        self._prefix = f"{o.prefix}:{namespace.hex()}:"
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}  # names a lease kept -> when to try removing again
        self._calls = BoundedCalls(self.name, _THREADS)
        self._store: MooncakeDistributedStore | None = None
        self._buffers: BufferPool | None = None
        self._connecting = threading.Lock()
        self._last_setup = 0.0
        self._closed = False
        what = f"the {self.name} tier (mooncake master at {self.master})"
        self.degraded = open_or_degrade(what, o.optional, lambda: self._open(what))

    @classmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> MooncakeTier:
        options = parse_options(MooncakeOptions, url)
        parts = urlsplit(f"//{url.netloc}")
        if not parts.hostname:
            raise ConfigError(
                "mooncake:// tier URL needs the master's address, e.g. "
                "mooncake://127.0.0.1:50051?metadata_server=http://127.0.0.1:8080/metadata"
            )
        try:
            port = parts.port or DEFAULT_MASTER_PORT
        except ValueError:
            raise ConfigError(f"mooncake:// tier URL has a bad port in {url.netloc!r}") from None
        if url.path.strip("/"):
            raise ConfigError(
                f"mooncake:// tier URL takes no path ({url.path!r}); use prefix= to set names apart"
            )
        return cls(namespace, parts.hostname, port, options)

    # --- the client -----------------------------------------------------------------------
    def _open(self, what: str) -> None:
        self._connect(what)
        store = self._store
        assert store is not None
        probe = self.name_of(bytes(16))
        codes = self._run(partial(store.batch_is_exist, [probe]), 0, "a first lookup")
        if codes[0] < 0:
            raise TierUnavailableError(f"{what} does not answer a lookup ({_code(codes[0])})")

    def _connect(self, what: str) -> None:
        """Set the client up, once the master answers. Mooncake's setup holds the interpreter
        while it retries a master that does not answer (for over a minute), so it is only
        called once the master's RPC port takes a connection and its admin server (when it
        has one there) answers within the timeout."""
        with self._connecting:
            if self._store is not None or self._closed:
                return
            self._last_setup = time.monotonic()
            self._check_master(what)
            o = self.options
            store = MooncakeDistributedStore()
            rc = store.setup(
                o.local_hostname or _local_address(self.host, self.port),
                o.metadata_server,
                o.global_segment_size,
                o.local_buffer_size,
                o.protocol,
                o.device_name or "",
                self.master,
            )
            if rc != 0:
                raise TierUnavailableError(
                    f"{what}: the Mooncake client was not set up (code {rc}); check "
                    "metadata_server= and protocol=, and the master's log"
                )
            buffers = BufferPool(
                store, max_bytes=o.local_buffer_size // 2, block_on_exhaustion=False
            )
            self._store, self._buffers = store, buffers

    def _check_master(self, what: str) -> None:
        """TierUnavailableError unless the master takes a connection and, where its admin
        server listens, answers it within the timeout (a paused master accepts and is silent)."""
        bound = max(0.5, self.options.timeout)
        try:
            socket.create_connection((self.host, self.port), bound).close()
        except OSError as exc:
            raise TierUnavailableError(
                f"{what} does not answer ({exc.strerror or exc}); start it or fix the URL"
            ) from None
        try:
            with urllib.request.urlopen(f"{self.admin}/health", timeout=bound):
                pass
        except urllib.error.HTTPError:
            pass  # it answered
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ConnectionRefusedError):
                return  # no admin server there: the RPC port is all there is to go by
            raise TierUnavailableError(
                f"{what} does not answer (its admin server at {self.admin}: {reason})"
            ) from None

    def _client(self) -> tuple[MooncakeDistributedStore, BufferPool]:
        """The client and its buffers; TierUnavailableError while it is not set up (a tier
        opened with ``optional=1`` tries again every few seconds)."""
        store, buffers = self._store, self._buffers
        if store is None or buffers is None:
            if self._closed:
                raise TierUnavailableError(f"the {self.name} tier is closed")
            what = f"the {self.name} tier (mooncake master at {self.master})"
            if time.monotonic() - self._last_setup < _SETUP_RETRY_S:
                raise TierUnavailableError(f"{what} is not connected: {self.degraded}")
            self._connect(what)
            store, buffers = self._store, self._buffers
            assert store is not None and buffers is not None
        self._remove_leased(store)
        return store, buffers

    @property
    def client(self) -> MooncakeDistributedStore:
        """The Mooncake client (object names: :meth:`name_of`); TierUnavailableError while it is
        not set up."""
        return self._client()[0]

    def _run(self, call: Callable, nbytes: int, what: str, on_drop=None):
        o = self.options
        return self._calls(call, o.timeout + nbytes / o.rate, f"{what} ({self.name})", on_drop)

    def name_of(self, key: bytes) -> str:
        """The Mooncake object name of a block."""
        return f"{self._prefix}{key.hex()}"

    def _runs(self, sizes: Sequence[int]) -> list[tuple[int, int]]:
        """``[start, end)`` runs of at most ``batch`` blocks whose bytes fit half the buffer."""
        return byte_windows(sizes, self.options.local_buffer_size // 2, self.options.batch)

    # --- batched verbs --------------------------------------------------------------------
    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        store, _ = self._client()
        names = [self.name_of(k) for k in keys]
        out: list[bool] = []
        for run in batches(names, self.options.batch):
            codes = self._run(partial(store.batch_is_exist, list(run)), 0, "a lookup")
            for code in codes:
                _raise_if_down(code, "a lookup")
            out += [c == 1 and n not in self._pending for n, c in zip(run, codes, strict=True)]
        return out

    def _get_many(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        store, _ = self._client()
        results: list[BlockHeader | BlockError | None] = []
        for a, b in self._runs([memoryview(o).nbytes for o in outs]):
            results += self._get_run(store, keys[a:b], outs[a:b])
        torn = [i for i, r in enumerate(results) if isinstance(r, CorruptBlockError)]
        if torn:  # an in-place upsert may have been under way: once more
            again = self._get_run(store, [keys[i] for i in torn], [outs[i] for i in torn])
            for i, result in zip(torn, again, strict=True):
                results[i] = result
        return results

    def _get_run(
        self, store: MooncakeDistributedStore, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        names = [self.name_of(k) for k in keys]
        nbytes = sum(memoryview(o).nbytes for o in outs)
        handles = self._run(partial(store.batch_get_buffer, names), nbytes, "a read")
        values = [
            None if h is None or n in self._pending else _view(h)
            for n, h in zip(names, handles, strict=True)
        ]
        try:
            return self._decode_all(keys, values, outs)
        finally:
            del values, handles  # the views before the handles that own their memory

    def put_many(self, items: Sequence[tuple[bytes, object, BlockMeta]]) -> list[bool]:
        if not items:
            return []
        store, buffers = self._client()
        packed = self._encode_all(self._packed, self._coded_items(items))
        out: list[bool] = []
        for a, b in self._runs([len(h) + s.nbytes for _, h, s in packed]):
            out += self._put_run(store, buffers, packed[a:b])
        return out

    def _packed(self, key: bytes, payload, meta: BlockMeta) -> tuple[str, bytes, memoryview]:
        header, stored = pack_block(self.namespace, key, payload, meta)
        return self.name_of(key), header, stored.cast("B")

    def _put_run(
        self,
        store: MooncakeDistributedStore,
        buffers: BufferPool,
        run: Sequence[tuple[str, bytes, memoryview]],
    ) -> list[bool]:
        """One ``batch_upsert_from`` of the blocks of ``run``, each copied into a buffer leased
        from the client's registered memory (a block without one is not admitted)."""
        leases: list = []
        sent: list[tuple[int, str, int, int]] = []  # (index in run, name, address, bytes)
        try:
            for i, (name, header, stored) in enumerate(run):
                size = len(header) + stored.nbytes
                try:
                    lease = buffers.acquire(size)
                except RuntimeError:  # the buffer is full: this block is not admitted
                    continue
                leases.append(lease)
                view = lease.buffer
                view[: len(header)] = header
                view[len(header) : size] = stored
                view.release()
                sent.append((i, name, lease.ptr, size))
        except BaseException:
            _release(leases)
            raise
        out = [False] * len(run)
        if not sent:
            self._count_refused(len(run))
            return out

        def upsert() -> list[int]:
            try:
                return store.batch_upsert_from(
                    [s[1] for s in sent], [s[2] for s in sent], [s[3] for s in sent]
                )
            finally:
                _release(leases)

        nbytes = sum(s[3] for s in sent)
        codes = self._run(upsert, nbytes, f"{len(sent)} writes", lambda: _release(leases))
        done: list[str] = []
        for (i, name, _, _), code in zip(sent, codes, strict=True):
            _raise_if_down(code, "a write")
            out[i] = code == 0
            if out[i]:
                done.append(name)
        if self._pending and done:
            with self._lock:
                for name in done:
                    self._pending.pop(name, None)
        self._count_refused(out.count(False))
        return out

    def _count_refused(self, n: int) -> None:
        if n:
            with self._lock:
                self.refused_puts += n

    def delete_many(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []
        store, _ = self._client()
        names = [self.name_of(k) for k in keys]
        out: list[bool] = []
        for run in batches(names, self.options.batch):
            codes = self._run(partial(store.batch_remove, list(run), False), 0, "a removal")
            with self._lock:
                for name, code in zip(run, codes, strict=True):
                    _raise_if_down(code, "a removal")
                    if name in self._pending:  # removed here already, the store follows
                        if code != _HAS_LEASE:
                            del self._pending[name]
                        out.append(False)
                    elif code == _HAS_LEASE:  # a reader holds it: removed later
                        self._pending[name] = time.monotonic() + _REMOVE_RETRY_S
                        out.append(True)
                    else:
                        out.append(code == 0)
        return out

    def _remove_leased(self, store: MooncakeDistributedStore) -> None:
        """Try again to remove the objects whose removal a lease put off (those due now)."""
        if not self._pending:
            return
        now = time.monotonic()
        with self._lock:
            due = [n for n, at in self._pending.items() if at <= now]
            for name in due:  # one attempt at a time, whichever thread comes first
                self._pending[name] = now + _REMOVE_RETRY_S
        if not due:
            return
        try:
            codes = self._run(partial(store.batch_remove, due, False), 0, "a delayed removal")
        except Exception:  # the master is away: the next verb fails on its own
            return
        with self._lock:
            for name, code in zip(due, codes, strict=True):
                if code in (0, _NOT_FOUND):
                    self._pending.pop(name, None)

    # --- listing --------------------------------------------------------------------------
    def _admin(self, path: str) -> bytes:
        try:
            with urllib.request.urlopen(f"{self.admin}{path}", timeout=_LIST_TIMEOUT_S) as r:
                return r.read()
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TierUnavailableError(
                f"the {self.name} tier: the master's admin server at {self.admin} does not "
                f"answer ({reason}); set admin=http://HOST:METRICS_PORT"
            ) from None

    def _names(self) -> list[str]:
        """This namespace's object names the master holds (less those removed here)."""
        lines = self._admin("/get_all_keys").decode(errors="replace").splitlines()
        with self._lock:
            pending = set(self._pending)
        return [n for n in lines if n.startswith(self._prefix) and n not in pending]

    def iter_keys(self) -> Iterator[bytes]:
        keys = [key_of(n) for n in self._names()]
        return iter([k for k in keys if k is not None])

    def usage(self) -> TierUsage:
        """Blocks and bytes of this namespace in the store, and the store's whole capacity
        (the admin server's listing: one pass over every object name)."""
        used = blocks = 0
        for run in batches(self._names(), _QUERY_BATCH):
            reply = json.loads(self._admin("/batch_query_keys?keys=" + ",".join(run)))
            for entry in reply.get("data", {}).values():
                replicas = entry.get("values") or []
                if entry.get("ok") and replicas:
                    used += int(replicas[0].get("size_", 0))
                    blocks += 1
        capacity = 0
        for line in self._admin("/metrics").decode(errors="replace").splitlines():
            if line.startswith("master_total_capacity_bytes "):
                capacity = int(float(line.split()[1]))
        notes = []
        if self.degraded:
            notes.append(f"degraded at open: {self.degraded}")
        if self.refused_puts:
            notes.append(f"{self.refused_puts} puts refused by the store (full?)")
        if self._pending:
            notes.append(f"{len(self._pending)} removals wait for readers' leases")
        return TierUsage(used, capacity, blocks, tuple(notes))

    def close(self) -> None:
        """Release the client. Mooncake's close takes up to a second (it waits for its client's
        poll threads); calls still waiting for a paused master are left to a thread of their
        own, which releases the client once they return."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            store, buffers = self._store, self._buffers
            self._store = self._buffers = None
        self._decoders.close()
        self._calls.close()

        def release() -> None:
            self._calls.join()
            if buffers is not None:
                buffers.close()
            if store is not None:
                store.close()

        if self._calls.overdue:  # a daemon: the process may end before the master answers
            threading.Thread(target=release, name=f"kvtier-{self.name}-close", daemon=True).start()
        else:
            release()


def _view(handle) -> memoryview:
    """The bytes of a buffer the client returned (valid while ``handle`` lives)."""
    return memoryview((ctypes.c_char * handle.size()).from_address(handle.ptr())).cast("B")


def _release(leases: list) -> None:
    for lease in leases:
        lease.release()


def _code(code: int) -> str:
    name = _RPC_ERRORS.get(code) or _FULL.get(code)
    return f"Mooncake error {code}{f' {name}' if name else ''}"


def _raise_if_down(code: int, what: str) -> None:
    """ConnectionError for a code that says the master did not answer (the cache then skips
    the tier a while)."""
    if code in _RPC_ERRORS:
        raise ConnectionError(f"the mooncake master did not answer {what} ({_code(code)})")


def _local_address(host: str, port: int) -> str:
    """The address this host reaches ``host`` from (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


__all__ = ["MooncakeTier"]
