"""Mooncake Store's own Python client, for ``kvtier bench peers``: the peer ``mooncake://`` is held
against, on the same master and the same chunks.

Two ways of using it: ``Mooncake client``, the calls a user of its Python API makes with bytes
(``put_batch``, ``get_batch``, each value then copied into the destination), and ``Mooncake raw
get``, its zero-copy calls on registered memory (``batch_put_from``, ``batch_get_into`` straight
into the destination): the floor of the medium. Both clients mount no memory of their own
(``global_segment_size`` 0): the store process the command started holds it, as ``mooncake://``
expects. Objects a read touched are leased for a while, so they are removed with ``force``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from kvtier.bench.peers_lmcache import PeerUnavailable
from kvtier.bench.peers_systems import MOONCAKE, PEER, REFERENCE, Geometry, Prompt, System

INSTALL = "pip install mooncake-transfer-engine-non-cuda==0.3.13.post1"
#: The client's registered buffer, as ``mooncake://`` has by default; a batch call moves at most
#: half of it (the tier's runs), so both sides cut a long prefix alike.
LOCAL_BUFFER = 256 * 1024 * 1024
BATCH_BYTES = LOCAL_BUFFER // 2


def mooncake_version() -> str:
    """The installed Mooncake client's version; PeerUnavailable when it cannot be imported."""
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")  # read when the library loads
    try:
        from importlib.metadata import version

        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PeerUnavailable(
            f"Mooncake Store's client is not available ({reason}); {INSTALL}"
        ) from None
    try:
        return version("mooncake-transfer-engine-non-cuda")
    except Exception:
        return version("mooncake-transfer-engine")


class MooncakeSystem(System):
    """A Mooncake Store client on the bench's master: plain (bytes) or ``raw`` (zero-copy)."""

    tier_class = MOONCAKE

    def __init__(self, address, geometry: Geometry, raw: bool = False):
        super().__init__()
        self.address = address
        self.geometry = geometry
        self.buffer_bytes = LOCAL_BUFFER
        self.raw = raw
        self.name = "Mooncake raw get" if raw else "Mooncake client"
        self.side = REFERENCE if raw else PEER
        self.kind = "raw" if raw else "client"
        calls = (
            "batch_put_from/batch_get_into on registered memory"
            if raw
            else ("put_batch/get_batch of bytes, copied into the destination")
        )
        self.detail = f"mooncake.store {calls}, master {address.master}, tcp"
        self.store_ = None
        self.registered: set[tuple[int, int]] = set()
        self.held: dict[str, int] = {}

    def open(self) -> MooncakeSystem:
        """Connect to the master (PeerUnavailable, one line, when it does not answer)."""
        from mooncake.store import MooncakeDistributedStore

        store = MooncakeDistributedStore()
        rc = store.setup(
            "127.0.0.1",
            self.address.metadata,
            0,
            self.buffer_bytes,
            "tcp",
            "",
            self.address.master,
        )
        if rc != 0:
            raise PeerUnavailable(f"{self.name}: setup with master {self.address.master} gave {rc}")
        self.store_ = store
        return self

    def prepare(self, buffers: Sequence[np.ndarray]) -> None:
        """Register every buffer the raw calls will read from or write into (untimed)."""
        if not self.raw or self.store_ is None:
            return
        for buf in buffers:
            span = (buf.ctypes.data, buf.nbytes)
            if span not in self.registered:
                rc = self.store_.register_buffer(*span)
                if rc != 0:
                    raise PeerUnavailable(f"{self.name}: register_buffer gave {rc}")
                self.registered.add(span)

    def _keys(self, prompt: Prompt) -> list[str]:
        return [
            f"kvtier-bench-peers/{self.kind}/{prompt.ident}/{i}" for i in range(prompt.n_chunks)
        ]

    def _batches(self, prompt: Prompt) -> list[range]:
        per = max(1, BATCH_BYTES // max(1, prompt.chunk_bytes))
        return [range(a, min(a + per, prompt.n_chunks)) for a in range(0, prompt.n_chunks, per)]

    def store(self, prompt: Prompt) -> None:
        store, keys = self.store_, self._keys(prompt)
        assert store is not None
        for run in self._batches(prompt):
            names = [keys[i] for i in run]
            if self.raw:
                self.prepare([prompt.kv])
                ptrs = [prompt.chunk(i).ctypes.data for i in run]
                codes = store.batch_put_from(names, ptrs, [prompt.chunk_bytes] * len(names))
                bad = [c for c in codes if c != 0]
            else:
                rc = store.put_batch(names, [memoryview(prompt.chunk(i)) for i in run])
                bad = [rc] if rc != 0 else []
            if bad:
                raise RuntimeError(f"{self.name}: a put gave {bad[0]}")
            for name in names:
                self.held[name] = prompt.chunk_bytes

    def seen(self, prompt: Prompt) -> int:
        assert self.store_ is not None
        found = self.store_.batch_is_exist(self._keys(prompt))
        n = 0
        while n < len(found) and found[n] == 1:
            n += 1
        return n * prompt.chunk_tokens

    def retrieve(self, prompt: Prompt, out: np.ndarray) -> int:
        store, keys = self.store_, self._keys(prompt)
        assert store is not None
        got = 0
        for run in self._batches(prompt):
            names = [keys[i] for i in run]
            if self.raw:
                self.prepare([out])
                ptrs = [prompt.chunk(i, out).ctypes.data for i in run]
                sizes = store.batch_get_into(names, ptrs, [prompt.chunk_bytes] * len(names))
                for n in sizes:
                    if n != prompt.chunk_bytes:
                        return got * prompt.chunk_tokens
                    got += 1
            else:
                for i, value in zip(run, store.get_batch(names), strict=True):
                    if not value or len(value) != prompt.chunk_bytes:
                        return got * prompt.chunk_tokens
                    np.copyto(prompt.chunk(i, out), np.frombuffer(value, dtype=np.uint8))
                    got += 1
        return got * prompt.chunk_tokens

    def forget(self, prompts: Sequence[Prompt]) -> None:
        assert self.store_ is not None
        for prompt in prompts:
            for name in self._keys(prompt):
                self.store_.remove(name, True)
                self.held.pop(name, None)

    def held_bytes(self) -> int | None:
        assert self.store_ is not None
        return sum(max(0, int(self.store_.get_size(name))) for name in self.held)

    def close(self) -> None:
        if self.store_ is None:
            return
        for ptr, _size in self.registered:
            self.store_.unregister_buffer(ptr)
        self.registered.clear()
        self.store_.close()
        self.store_ = None


__all__ = ["INSTALL", "MooncakeSystem", "mooncake_version"]
