"""Raw-client references for the shared tiers: the same library the tier uses, without kvtier.

For a Redis/Valkey tier: redis-py ``SET``/``GET`` (a pipeline per request of several blocks) as
redis-py comes, on a client of its own to the same server; for an S3 tier: obstore
``put``/``get`` on the tier's store. Values are as large as the tier's objects (the block
container's header plus the payload), so both sides move the same bytes, in the same threads
and requests (:func:`run_pass`). The reference neither checks nor copies what it reads; kvtier
does both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.bench.driver import PassPlan, run_pass
from kvtier.bench.stats import PassResult
from kvtier.codec import HEADER_SIZE
from kvtier.tiers.base import Tier


class ClientReference:
    """A reference over ``items`` values of ``item_bytes`` (+ the header) under its own names."""

    kind = "client"

    def __init__(self, tier: Tier, items: int, item_bytes: int):
        self.tier = tier
        rng = np.random.default_rng()
        self.value = rng.integers(0, 256, item_bytes + HEADER_SIZE, dtype=np.uint8).tobytes()
        self.names = [f"kvtier-bench-raw/{id(self):x}/{i}" for i in range(items)]

    def detail(self, plan: PassPlan) -> str:
        raise NotImplementedError

    def forget(self) -> None:
        """Remove what the reference wrote, as the bench removes kvtier's blocks after each
        round, so both sides' next writes meet the same server state (new keys)."""
        self.close()

    def close(self) -> None:
        """Remove what the reference wrote."""


class RedisClientReference(ClientReference):
    """redis-py SET/GET (pipelined per request) as redis-py comes, on a client of its own to
    the tier's server (the tier's connections send and receive values without redis-py's
    copies: that is part of what is measured)."""

    def __init__(self, tier: Tier, items: int, item_bytes: int):
        super().__init__(tier, items, item_bytes)
        self.client = tier.stock_client()

    def detail(self, plan: PassPlan) -> str:
        how = "pipelines of SET/GET" if plan.batch > 1 else "SET/GET"
        return f"redis-py {how}, {plan.batch} per request, {plan.threads} threads"

    def _each(self, indices: Sequence[int], op: str) -> None:
        client = self.client
        if len(indices) == 1:
            name = self.names[indices[0]]
            client.set(name, self.value) if op == "write" else client.get(name)
            return
        pipe = client.pipeline(transaction=False)
        for i in indices:
            pipe.set(self.names[i], self.value) if op == "write" else pipe.get(self.names[i])
        pipe.execute()

    def write(self, plan: PassPlan) -> PassResult:
        return run_pass(plan, lambda _w, indices: self._each(indices, "write"))

    def read(self, plan: PassPlan) -> PassResult:
        return run_pass(plan, lambda _w, indices: self._each(indices, "read"))

    def forget(self) -> None:
        for i in range(0, len(self.names), 512):
            self.client.delete(*self.names[i : i + 512])

    def close(self) -> None:
        try:
            self.forget()
        finally:
            self.client.close()


class S3ClientReference(ClientReference):
    """obstore put/get (one call per block) on the tier's store."""

    def detail(self, plan: PassPlan) -> str:
        return f"obstore put/get, {plan.batch} per request, {plan.threads} threads"

    def write(self, plan: PassPlan) -> PassResult:
        import obstore

        store = self.tier.store

        def work(_worker: int, indices: Sequence[int]) -> None:
            for i in indices:
                obstore.put(store, self.names[i], self.value)

        return run_pass(plan, work)

    def read(self, plan: PassPlan) -> PassResult:
        import obstore

        store = self.tier.store

        def work(_worker: int, indices: Sequence[int]) -> None:
            for i in indices:
                obstore.get(store, self.names[i]).bytes()

        return run_pass(plan, work)

    def close(self) -> None:
        import obstore

        obstore.delete(self.tier.store, self.names)


def client_reference(tier: Tier, items: int, item_bytes: int) -> ClientReference | None:
    """The raw-client reference of a shared tier (None for other tiers)."""
    if tier.scheme == "redis":
        return RedisClientReference(tier, items, item_bytes)
    if tier.scheme == "s3":
        return S3ClientReference(tier, items, item_bytes)
    return None


__all__ = ["ClientReference", "RedisClientReference", "S3ClientReference", "client_reference"]
