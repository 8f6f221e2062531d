"""The Tier conformance suite: every storage tier passes the same tests (zarr's StoreTests idea).

Subclass :class:`TierConformance` in a test module (its name must start with ``Test``), implement
:meth:`~TierConformance.make_tier`, and for the fault-injection tests
:meth:`~TierConformance.corrupt`; pytest then runs every ``test_*`` method below against it::

    class TestMemoryTier(TierConformance):
        def make_tier(self, root, namespace, capacity, eviction="lru"):
            return MemoryTier(namespace, capacity, eviction=eviction)

Payloads are self-describing (key and version in the first 24 bytes, the rest derived from them),
so a reader can tell a torn or foreign block from a good one without knowing what was written.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import xxhash

from kvtier import codec
from kvtier.codec import HEADER_SIZE, BlockHeader, BlockMeta
from kvtier.policy.eviction import POLICIES
from kvtier.tiers.base import Tier

NS_A = xxhash.xxh3_128_digest(b"kvtier-conformance-a")
NS_B = xxhash.xxh3_128_digest(b"kvtier-conformance-b")
CORRUPTIONS = ("payload", "header", "truncate", "foreign", "swap")


def corrupt_value(
    how: str,
    get: Callable[[str], bytes],
    put: Callable[[str, bytes], None],
    name: str,
    foreign: str | None = None,
    other: str | None = None,
) -> None:
    """Damage the value ``name`` of a key-value store the way ``how`` (one of
    :data:`CORRUPTIONS`) says, through the store's own ``get`` and ``put``: ``foreign`` names
    the value another namespace holds for the same key, ``other`` the value ``swap`` exchanges
    it with."""
    value = bytearray(get(name))
    if how == "payload":
        value[-1] ^= 0x01
    elif how == "header":
        value[1] ^= 0x10
    elif how == "truncate":
        value = value[: len(value) // 2]
    elif how == "foreign":
        assert foreign is not None
        value = bytearray(get(foreign))
    elif how == "swap":
        assert other is not None
        theirs = get(other)
        put(other, bytes(value))
        value = bytearray(theirs)
    put(name, bytes(value))


def _policy_names() -> list[str]:
    names: dict[type, str] = {}
    for name, cls in POLICIES.items():
        names.setdefault(cls, name)  # one name per policy (aliases skipped)
    return list(names.values())


EVICTIONS = _policy_names()
_STAMP = 24  # key (16 bytes) + version (8 bytes)


def make_key(i: int, salt: bytes = b"") -> bytes:
    """A 16-byte block key."""
    return xxhash.xxh3_128_digest(salt + i.to_bytes(8, "little"))


def make_payload(key: bytes, version: int, nbytes: int) -> np.ndarray:
    """A payload whose every byte follows from (key, version), stamped in its first 24 bytes."""
    seed = xxhash.xxh3_64_intdigest(key + version.to_bytes(8, "little"))
    out = np.frombuffer(np.random.default_rng(seed).bytes(nbytes), dtype=np.uint8).copy()
    stamp = np.frombuffer(key + version.to_bytes(8, "little"), np.uint8)
    out[: min(nbytes, _STAMP)] = stamp[: min(nbytes, _STAMP)]
    return out


def check_payload(buf, nbytes: int, key: bytes | None = None) -> int:
    """The version of a self-describing payload; AssertionError if any byte is off (torn)."""
    data = np.frombuffer(memoryview(buf).cast("B"), np.uint8)[:nbytes]
    assert nbytes >= _STAMP, "self-describing payloads need at least 24 bytes"
    stamp = data[:_STAMP].tobytes()
    if key is not None:
        assert stamp[:16] == key, "payload of another key"
    version = int.from_bytes(stamp[16:], "little")
    expected = make_payload(stamp[:16], version, nbytes)
    assert np.array_equal(data, expected), "torn or damaged payload"
    return version


def read_all_blocks(tier: Tier, max_bytes: int) -> int:
    """Read every indexed block back; each must be whole and exact. Returns blocks read."""
    out = np.zeros(max_bytes, np.uint8)
    count = 0
    for key in tier.iter_keys():
        header = tier.get_into(key, out)
        assert isinstance(header, BlockHeader), f"block {key.hex()} missing after recovery"
        check_payload(out, header.raw_len, key)
        count += 1
    return count


def wait_lines(proc: subprocess.Popen, lines: int) -> None:
    """Wait for ``lines`` lines from a writer subprocess's stdout (one per step it took)."""
    for _ in range(lines):
        if not proc.stdout.readline():
            raise AssertionError(f"writer died early: {proc.stderr.read()}")


def kill_mid_burst(proc: subprocess.Popen, lines: int, pause: float) -> None:
    """SIGKILL a writer subprocess ``pause`` seconds after its ``lines``-th step."""
    try:
        wait_lines(proc, lines)
        time.sleep(pause)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


class TierConformance:
    """Generic tests for one Tier implementation. Subclasses provide the tier."""

    block_bytes: ClassVar[int] = 16 * 1024
    capacity_blocks: ClassVar[int] = 12

    # --- what a subclass provides ------------------------------------------------------------
    def make_tier(self, root: Path, namespace: bytes, capacity: int, eviction: str = "lru") -> Tier:
        """Open the tier under test holding at most ``capacity`` bytes (``root``: scratch dir).

        Two calls with the same ``root`` and ``namespace`` must reach the same storage when the
        tier is persistent or shared.
        """
        raise NotImplementedError

    def corrupt(
        self,
        tier: Tier,
        key: bytes,
        how: str,
        *,
        other_key: bytes | None = None,
        other_tier: Tier | None = None,
    ) -> bool:
        """Damage the stored block of ``key`` behind the tier's back; False if not possible.

        ``how``: ``payload`` flip one bit of the stored payload; ``header`` flip one bit of the
        header's magic; ``truncate`` cut the block short; ``foreign`` replace it with the block
        ``other_tier`` (another namespace) holds for the same key; ``swap`` exchange it with the
        block of ``other_key``.
        """
        return False

    def footprint(self, payload_bytes: int) -> int:
        """An upper bound of the bytes one block of ``payload_bytes`` takes in the tier."""
        return 2 * 4096 + -(-(payload_bytes + HEADER_SIZE) // 4096) * 4096

    # --- fixtures ----------------------------------------------------------------------------
    @pytest.fixture
    def open_tier(self, tmp_path: Path) -> Iterator[Callable[..., Tier]]:
        """``open_tier(namespace=NS_A, capacity=None, eviction="lru")``; closed at teardown."""
        opened: list[Tier] = []

        def open_(namespace: bytes = NS_A, capacity: int | None = None, eviction: str = "lru"):
            cap = capacity or self.capacity_blocks * self.footprint(self.block_bytes)
            tier = self.make_tier(tmp_path, namespace, cap, eviction)
            opened.append(tier)
            return tier

        yield open_
        for tier in opened:
            tier.close()

    @pytest.fixture
    def tier(self, open_tier) -> Tier:
        """The tier under test with room for ``capacity_blocks`` blocks."""
        return open_tier()

    # --- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _needs_eviction(tier: Tier) -> None:
        """Skip a capacity or eviction test on a tier whose server owns its capacity."""
        if not tier.capabilities.evicts:
            pytest.skip("the tier's capacity belongs to its server (evicts=False)")

    def _put(self, tier: Tier, i: int, version: int = 0, nbytes: int | None = None) -> bytes:
        key = make_key(i)
        assert tier.put(key, make_payload(key, version, nbytes or self.block_bytes))
        return key

    def _read(self, tier: Tier, key: bytes, nbytes: int | None = None) -> np.ndarray | None:
        out = np.zeros(nbytes or self.block_bytes, np.uint8)
        return None if tier.get_into(key, out) is None else out

    # --- single-block verbs ------------------------------------------------------------------
    def test_put_get_roundtrip(self, tier: Tier):
        key = make_key(1)
        payload = make_payload(key, 3, self.block_bytes)
        meta = BlockMeta("bf16", (2, 4, self.block_bytes // 16))
        assert tier.put(key, payload, meta)
        assert tier.contains(key)
        out = np.zeros(self.block_bytes, np.uint8)
        header = tier.get_into(key, out)
        assert isinstance(header, BlockHeader)
        assert header.meta == meta
        assert header.raw_len == self.block_bytes
        assert header.key == key and header.namespace == tier.namespace
        assert np.array_equal(out, payload)

    def test_miss(self, tier: Tier):
        key = make_key(404)
        assert not tier.contains(key)
        assert tier.get_into(key, np.zeros(16, np.uint8)) is None
        assert tier.delete(key) is False

    def test_odd_sizes(self, tier: Tier):
        sizes = [0, 1, 100, 4095, 4096, 4097, 3 * self.block_bytes // 2 + 7]
        for i, n in enumerate(sizes):
            key = make_key(i)
            assert tier.put(key, make_payload(key, 0, n))
        for i, n in enumerate(sizes):
            key = make_key(i)
            out = np.zeros(n, np.uint8)
            assert tier.get_into(key, out).raw_len == n
            assert np.array_equal(out, make_payload(key, 0, n))

    def test_larger_buffer_keeps_its_tail(self, tier: Tier):
        key = self._put(tier, 1)
        out = np.full(self.block_bytes + 3 * 4096 + 5, 0xAB, np.uint8)
        assert tier.get_into(key, out).raw_len == self.block_bytes
        check_payload(out, self.block_bytes, key)
        assert (out[self.block_bytes :] == 0xAB).all(), "bytes past the block were written"

    def test_buffer_too_small(self, tier: Tier):
        key = self._put(tier, 1)
        with pytest.raises(codec.BufferTooSmallError):
            tier.get_into(key, np.zeros(self.block_bytes - 1, np.uint8))
        check_payload(self._read(tier, key), self.block_bytes, key)

    def test_accepts_any_writable_buffer(self, tier: Tier):
        key = self._put(tier, 1)
        for out in (bytearray(self.block_bytes), np.zeros((4, self.block_bytes // 4), np.uint8)):
            assert tier.get_into(key, out) is not None
            check_payload(out, self.block_bytes, key)
        view = memoryview(bytearray(self.block_bytes + 1))[1:]  # unaligned
        assert tier.get_into(key, view) is not None
        check_payload(view, self.block_bytes, key)

    def test_overwrite(self, tier: Tier):
        key = self._put(tier, 1, version=1)
        self._put(tier, 1, version=2)
        assert check_payload(self._read(tier, key), self.block_bytes, key) == 2
        assert tier.usage().blocks == 1

    def test_delete(self, tier: Tier):
        key = self._put(tier, 1)
        assert tier.delete(key) is True
        assert not tier.contains(key)
        assert self._read(tier, key) is None
        assert tier.usage().blocks == 0

    def test_iter_keys(self, tier: Tier):
        keys = {self._put(tier, i) for i in range(5)}
        assert set(tier.iter_keys()) == keys
        tier.delete(keys.pop())
        assert set(tier.iter_keys()) == keys

    # --- batched forms -----------------------------------------------------------------------
    def test_batched_forms(self, tier: Tier):
        keys = [make_key(i) for i in range(6)]
        items = [(k, make_payload(k, 7, self.block_bytes), BlockMeta()) for k in keys[::2]]
        assert tier.put_many(items) == [True] * 3
        assert tier.contains_many(keys) == [True, False] * 3
        outs = [np.zeros(self.block_bytes, np.uint8) for _ in keys]
        results = tier.get_many_into(keys, outs)
        for i, (res, out) in enumerate(zip(results, outs, strict=True)):
            if i % 2:
                assert res is None
            else:
                assert isinstance(res, BlockHeader)
                assert check_payload(out, self.block_bytes, keys[i]) == 7
        assert tier.delete_many(keys) == [True, False] * 3
        assert tier.usage().blocks == 0
        assert tier.get_many_into([], []) == []
        assert tier.put_many([]) == []

    # --- isolation ---------------------------------------------------------------------------
    def test_namespace_isolation(self, open_tier):
        a, b = open_tier(NS_A), open_tier(NS_B)
        key = make_key(1)
        assert a.put(key, make_payload(key, 1, self.block_bytes))
        assert not b.contains(key)
        assert b.get_into(key, np.zeros(self.block_bytes, np.uint8)) is None
        assert b.put(key, make_payload(key, 2, self.block_bytes))
        assert check_payload(self._read(a, key), self.block_bytes, key) == 1
        assert check_payload(self._read(b, key), self.block_bytes, key) == 2
        assert b.delete(key)
        assert check_payload(self._read(a, key), self.block_bytes, key) == 1

    # --- damaged blocks ----------------------------------------------------------------------
    @pytest.mark.parametrize("how", CORRUPTIONS)
    def test_damaged_block_is_never_served(self, open_tier, how: str):
        tier = open_tier(NS_A)
        if how == "payload" and not tier.capabilities.verifies_checksum:
            pytest.skip("this tier trusts its payload bytes (verifies_checksum=False)")
        key, other = self._put(tier, 1, 1), self._put(tier, 2, 2)
        spare = self._put(tier, 3, 3)
        source = None
        if how == "foreign":
            source = open_tier(NS_B)
            assert source.put(key, make_payload(key, 9, self.block_bytes))
        if not self.corrupt(tier, key, how, other_key=other, other_tier=source):
            pytest.skip(f"{type(tier).__name__} cannot be damaged by {how!r} in tests")
        expected = (
            codec.ForeignBlockError if how in ("foreign", "swap") else codec.CorruptBlockError
        )
        with pytest.raises(expected):
            tier.get_into(key, np.zeros(self.block_bytes, np.uint8))
        outs = [np.zeros(self.block_bytes, np.uint8) for _ in range(2)]
        results = tier.get_many_into([key, spare], outs)
        assert isinstance(results[0], expected)
        assert isinstance(results[1], BlockHeader)
        assert check_payload(outs[1], self.block_bytes, spare) == 3
        if how == "swap":
            with pytest.raises(codec.ForeignBlockError):
                tier.get_into(other, np.zeros(self.block_bytes, np.uint8))
        tier.delete(key)  # what the cache does with a bad block
        assert tier.get_into(key, np.zeros(self.block_bytes, np.uint8)) is None
        self._put(tier, 1, 4)
        assert check_payload(self._read(tier, key), self.block_bytes, key) == 4

    # --- capacity and eviction ---------------------------------------------------------------
    def test_oversized_block_is_refused(self, open_tier):
        cap = 4 * self.footprint(self.block_bytes)
        tier = open_tier(capacity=cap)
        self._needs_eviction(tier)
        key = make_key(1)
        before = tier.usage()
        assert tier.put(key, make_payload(key, 0, cap + 1)) is False
        assert not tier.contains(key)
        assert tier.usage().blocks == before.blocks

    def test_usage_accounting(self, tier: Tier):
        keys = [self._put(tier, i) for i in range(4)]
        usage = tier.usage()
        assert usage.blocks == 4
        assert 4 * (HEADER_SIZE + self.block_bytes) <= usage.used_bytes
        if tier.capabilities.evicts:
            assert usage.used_bytes <= usage.capacity_bytes
        tier.delete_many(keys)
        assert tier.usage().used_bytes == 0 and tier.usage().blocks == 0

    @pytest.mark.parametrize("eviction", EVICTIONS)
    def test_capacity_bound_under_churn(self, open_tier, eviction: str):
        tier = open_tier(eviction=eviction)
        self._needs_eviction(tier)
        cap = tier.usage().capacity_bytes
        rng = random.Random(1234)
        versions: dict[bytes, tuple[int, int]] = {}  # key -> (version, size) last put
        evicted: list[bytes] = []
        tier.add_eviction_listener(evicted.append)
        for step in range(250):
            i = rng.randrange(40)
            key = make_key(i)
            op = rng.random()
            if op < 0.6:
                n = rng.randrange(self.block_bytes // 4, self.block_bytes * 2)
                if tier.put(key, make_payload(key, step, n)):
                    versions[key] = (step, n)
            elif op < 0.85:
                out = np.zeros(self.block_bytes * 2, np.uint8)
                header = tier.get_into(key, out)
                if header is not None:
                    assert check_payload(out, header.raw_len, key) == versions[key][0]
            else:
                tier.delete(key)
            usage = tier.usage()
            assert 0 <= usage.used_bytes <= cap, f"step {step}: {usage}"
        held = list(tier.iter_keys())
        assert tier.usage().blocks == len(held)
        assert evicted, "the churn should have needed evictions"
        for key in held:
            version, n = versions[key]
            out = np.zeros(n, np.uint8)
            assert tier.get_into(key, out) is not None
            assert check_payload(out, n, key) == version

    def test_eviction_listener(self, open_tier):
        tier = open_tier(capacity=4 * self.footprint(self.block_bytes))
        self._needs_eviction(tier)
        evicted: list[bytes] = []
        tier.add_eviction_listener(evicted.append)
        keys = [self._put(tier, i) for i in range(10)]
        held = set(tier.iter_keys())
        assert evicted and not held & set(evicted)
        assert held | set(evicted) == set(keys)
        assert not any(tier.contains(k) for k in evicted)
        assert keys[-1] in held

    def test_lru_keeps_recently_read_blocks(self, open_tier):
        tier = open_tier(capacity=4 * self.footprint(self.block_bytes), eviction="lru")
        self._needs_eviction(tier)
        evicted: list[bytes] = []
        tier.add_eviction_listener(evicted.append)
        keys: list[bytes] = []
        while not evicted:
            keys.append(self._put(tier, len(keys)))
        held = [k for k in keys if tier.contains(k)]  # oldest first
        assert len(held) >= 2
        assert self._read(tier, held[0]) is not None  # now the most recently used
        evicted.clear()
        self._put(tier, len(keys))
        assert tier.contains(held[0])
        assert held[1] in evicted

    def test_spill_listener_sees_victims_first(self, open_tier):
        tier = open_tier(capacity=3 * self.footprint(self.block_bytes))
        self._needs_eviction(tier)
        spilled: dict[bytes, int] = {}
        order: list[str] = []

        def on_spill(key: bytes, payload: memoryview, meta: BlockMeta) -> None:
            assert tier.contains(key), "spill must come before the block leaves"
            spilled[key] = check_payload(payload, payload.nbytes, key)
            order.append("spill")

        tier.add_spill_listener(on_spill)
        tier.add_eviction_listener(lambda key: order.append("evict"))
        for i in range(6):
            self._put(tier, i, version=i)
        assert spilled, "no block was spilled"
        assert order.index("spill") < order.index("evict")
        for key, version in spilled.items():
            assert key == make_key(version)

    def test_pinned_blocks_are_not_evicted(self, open_tier):
        tier = open_tier(capacity=4 * self.footprint(self.block_bytes))
        self._needs_eviction(tier)
        pinned: set[bytes] = set()
        tier.set_pinned(pinned.__contains__)
        first = [self._put(tier, i) for i in range(2)]
        pinned.update(first)
        for i in range(2, 9):
            self._put(tier, i)
        assert all(tier.contains(k) for k in first)
        pinned.update(tier.iter_keys())
        key = make_key(99)
        assert tier.put(key, make_payload(key, 0, self.block_bytes)) is False
        assert all(tier.contains(k) for k in first)

    # --- concurrency -------------------------------------------------------------------------
    def test_threads_never_see_torn_blocks(self, tier: Tier):
        keys = [make_key(i) for i in range(5)]
        n = self.block_bytes * 2
        for k in keys:
            assert tier.put(k, make_payload(k, 0, n))
        errors: list[BaseException] = []
        seen = [0]

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            for step in range(1, 40):
                k = rng.choice(keys)
                if rng.random() < 0.1:
                    tier.delete(k)
                else:
                    tier.put(k, make_payload(k, seed * 1000 + step, n))

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            out = np.zeros(n, np.uint8)
            for _ in range(80):
                k = rng.choice(keys)
                if rng.random() < 0.5:
                    header = tier.get_into(k, out)
                    if header is not None:
                        check_payload(out, n, k)
                        seen[0] += 1
                else:
                    outs = [np.zeros(n, np.uint8) for _ in range(3)]
                    batch = rng.sample(keys, 3)
                    results = tier.get_many_into(batch, outs)
                    for bk, res, o in zip(batch, results, outs, strict=True):
                        assert not isinstance(res, codec.BlockError), res
                        if res is not None:
                            check_payload(o, n, bk)
                            seen[0] += 1

        def guard(fn, seed):
            try:
                fn(seed)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=guard, args=(writer, s)) for s in (1, 2)]
        threads += [threading.Thread(target=guard, args=(reader, s)) for s in (3, 4, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert seen[0] > 0
        usage = tier.usage()
        assert usage.used_bytes <= usage.capacity_bytes or not tier.capabilities.evicts
        assert usage.blocks == len(list(tier.iter_keys()))

    # --- persistence -------------------------------------------------------------------------
    def test_reopen_keeps_blocks(self, open_tier):
        tier = open_tier()
        if not tier.capabilities.persistent:
            pytest.skip("not a persistent tier")
        keys = [self._put(tier, i, version=i) for i in range(4)]
        tier.delete(keys[0])
        tier.close()
        again = open_tier()
        assert set(again.iter_keys()) == set(keys[1:])
        for i, key in enumerate(keys[1:], 1):
            assert check_payload(self._read(again, key), self.block_bytes, key) == i
