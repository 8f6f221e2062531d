"""The memory tier: conformance suite, URL options, slab reuse, pinned readers."""

from __future__ import annotations

import functools
import gc
import weakref

import numpy as np
import pytest

from kvtier.codec import HEADER_SIZE, BlockError, BlockHeader, BlockMeta, BufferTooSmallError
from kvtier.errors import ConfigError
from kvtier.specs import MiB
from kvtier.testing.tier_conformance import (
    NS_A,
    TierConformance,
    check_payload,
    make_key,
    make_payload,
)
from kvtier.tiers import open_tier
from kvtier.tiers.memory import MemoryTier


class TestMemoryTier(TierConformance):
    def make_tier(self, root, namespace, capacity, eviction="lru"):
        return MemoryTier(namespace, capacity, eviction=eviction, pin=False)

    def corrupt(self, tier, key, how, *, other_key=None, other_tier=None):
        views = tier.block_views(key)
        if how == "header":
            views[0][1] ^= 0x10  # a bit of the magic
        elif how == "foreign":
            theirs = other_tier.block_views(key)
            if len(theirs) != len(views):
                return False
            for mine, other in zip(views, theirs, strict=True):
                mine[:] = other
        elif how == "swap":
            theirs = tier.block_views(other_key)
            if len(theirs) != len(views):
                return False
            for mine, other in zip(views, theirs, strict=True):
                saved = mine.copy()
                mine[:] = other
                other[:] = saved
        else:  # payload flips go unnoticed by design; there is no truncation in memory
            return False
        return True


class TestMemoryTierInPython(TestMemoryTier):
    """The same contract without the C read path (``native=0``), small copies holding the GIL."""

    def make_tier(self, root, namespace, capacity, eviction="lru"):
        return MemoryTier(namespace, capacity, eviction=eviction, pin=False, native=False)


class TestMemoryTierCopiesReleasingTheGil(TestMemoryTier):
    """The same contract in Python with every block copied by numpy (``gil_copy_max=0``)."""

    def make_tier(self, root, namespace, capacity, eviction="lru"):
        return MemoryTier(
            namespace, capacity, eviction=eviction, pin=False, gil_copy_max=0, native=False
        )


def test_url_options():
    tier = open_tier("memory://?size=8MiB&eviction=lru&slot=64KiB&pin=0", NS_A)
    assert isinstance(tier, MemoryTier)
    assert tier.usage().capacity_bytes == 8 * MiB
    assert tier.slot_size == 64 * 1024
    assert not tier.pinned
    assert tier.capabilities.verifies_checksum is False
    assert tier.gil_copy_max == 256 * 1024
    assert open_tier("memory://?size=8MiB&gil_copy_max=0", NS_A).gil_copy_max == 0
    assert open_tier("memory://?size=8MiB&native=0", NS_A)._get1 is None


def test_the_c_read_path_is_built_and_used():
    """make setup builds tiers/memory/_fastget.c (gcc is on every machine this runs on)."""
    from kvtier.tiers.memory import tier as memory

    assert memory._native_get1 is not None, "the C read path did not build; pip install -e ."
    tier = MemoryTier(NS_A, 4 * MiB, pin=False, native=True)
    key = make_key(3)
    payload = make_payload(key, 1, 20_000)
    assert tier.put(key, payload)
    out = np.zeros(20_000, np.uint8)
    [header] = memory._native_get1(tier._index, key, out, tier._touched)  # the C path itself
    assert header.raw_len == 20_000 and check_payload(out, 20_000, key) == 1
    assert memory._native_get1(tier._index, make_key(4), out, tier._touched) is None  # a miss
    assert memory._native_get1(tier._index, key, np.zeros(20_001, np.uint8), []) is None
    tier.block_views(key)[0][40] ^= 1  # a changed header: never served by the C path
    assert memory._native_get1(tier._index, key, out, tier._touched) is None


def test_the_c_entry_serves_one_block_and_hands_the_rest_to_python():
    from kvtier.tiers.memory import tier as memory

    assert memory._native_get_many is not None
    tier = MemoryTier(NS_A, 8 * MiB, pin=False, native=True)
    assert type(tier.get_many_into) is functools.partial  # the C entry, not the Python method
    keys = [make_key(i) for i in range(3)]
    assert all(tier.put_many([(k, make_payload(k, 1, 9_000), BlockMeta()) for k in keys]))
    outs = [np.zeros(9_000, np.uint8) for _ in keys]
    [header] = tier.get_many_into(keys[:1], outs[:1])  # in C
    assert header.raw_len == 9_000 and check_payload(outs[0], 9_000, keys[0]) == 1
    got = tier.get_many_into(keys, outs)  # several blocks: the Python method
    assert all(type(h) is BlockHeader for h in got)
    assert [check_payload(o, 9_000, k) for o, k in zip(outs, keys, strict=True)] == [1, 1, 1]
    assert tier.get_many_into((keys[1],), (outs[1],))[0].raw_len == 9_000  # tuples: Python
    assert tier.get_many_into([make_key(9)], [outs[0]]) == [None]  # a miss
    with pytest.raises(BufferTooSmallError):  # raised through the C entry, as in Python
        tier.get_many_into([keys[0]], [np.zeros(10, np.uint8)])
    with pytest.raises(ValueError):
        tier.get_many_into(keys, outs[:2])


def test_unlocked_reads_reach_the_policy_and_the_queue_stays_bounded():
    from kvtier.tiers.memory import tier as memory

    tier = MemoryTier(NS_A, 8 * 4096, slot_size=4096 + 4096, pin=False)  # 4 blocks
    keys = [make_key(i) for i in range(5)]
    assert all(tier.put_many([(k, make_payload(k, 1, 4096), BlockMeta()) for k in keys[:4]]))
    out = np.zeros(4096, np.uint8)
    for _ in range(memory._TOUCH_MAX + 5):  # the oldest block is read most recently
        assert type(tier.get_many_into([keys[0]], [out])[0]) is BlockHeader
    assert len(tier._touched) <= memory._TOUCH_MAX  # a reader drained the queue
    assert tier.get_many_into([keys[0]], [out])  # one more read left in the queue
    assert tier.put(keys[4], make_payload(keys[4], 1, 4096))  # evicts: the policy saw the reads
    assert tier.contains(keys[0]) and not tier.contains(keys[1])


def test_a_dropped_tier_is_freed_without_the_cycle_collector():
    tier = MemoryTier(NS_A, 8 * MiB, pin=False)
    assert tier.put(make_key(1), b"x" * 5000)
    gone = weakref.ref(tier)
    gc.disable()
    try:
        del tier
        assert gone() is None  # no reference cycle holds it (or its arena)
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "memory://?size=lots",
        "memory://?size=8MiB&colour=blue",
        "memory://?size=8MiB&pin=maybe",
        "memory://?size=8MiB&eviction=fifo",
        "memory://?size=1MiB&slot=2MiB",
        "memory://?size=8MiB&gil_copy_max=-1",
        "memory://?size=8MiB&native=maybe",
    ],
)
def test_bad_urls(url):
    with pytest.raises(ConfigError):
        open_tier(url, NS_A)


def test_every_eviction_policy_is_accepted():
    from kvtier.policy.eviction import POLICIES

    for name in POLICIES:
        assert open_tier(f"memory://?size=1MiB&eviction={name}", NS_A).put(b"k" * 16, b"x")


def test_slots_are_reused_not_allocated_per_block():
    tier = MemoryTier(NS_A, 2 * MiB, pin=False)
    payloads = [make_payload(make_key(i), 0, 60_000) for i in range(4)]
    for step in range(200):
        key = make_key(step % 50)
        tier.put(key, payloads[step % 4])
        if step % 3 == 0:
            tier.delete(make_key((step * 7) % 50))
    slot = tier.slot_size
    assert slot == 15 * 4096  # 60000 bytes + the header, rounded up to 4 KiB
    assert tier.mapped_bytes <= 2 * MiB
    mapped = tier.mapped_bytes
    for step in range(200):
        tier.put(make_key(1000 + step), payloads[step % 4])
    assert tier.mapped_bytes == mapped  # full arena: every new block took a reused slot


def test_blocks_larger_than_a_slot_span_several():
    tier = MemoryTier(NS_A, 4 * MiB, slot_size=16 * 1024, pin=False)
    key = make_key(1)
    payload = make_payload(key, 5, 100_000)
    assert tier.put(key, payload)
    assert len(tier.block_views(key)) == -(-(100_000 + HEADER_SIZE) // (16 * 1024))
    out = np.zeros(100_000, np.uint8)
    assert tier.get_into(key, out).raw_len == 100_000
    assert check_payload(out, 100_000, key) == 5
    assert tier.usage().used_bytes == 7 * 16 * 1024


def test_eviction_waits_for_readers_of_the_victim():
    """A block evicted while a reader copies it keeps its slots until the reader is done.

    The reader is simulated by taking the pin ``get_into`` takes before its unlocked copy.
    """
    tier = MemoryTier(NS_A, 2 * 72 * 1024, pin=False)  # two slots
    k1, k2, k3 = make_key(1), make_key(2), make_key(3)
    for k in (k1, k2):
        assert tier.put(k, make_payload(k, 0, 64 * 1024))
    block = tier._index[k1]
    with tier._lock:
        block.pins += 1  # a reader is copying k1 right now
    assert tier.block_views(k1)
    assert tier.put(k3, make_payload(k3, 0, 64 * 1024))  # must evict k2, not the busy k1
    assert tier.contains(k1) and not tier.contains(k2)
    assert tier.delete(k1)  # dropped while pinned: its slot stays until the reader is done
    assert tier.usage().used_bytes == 2 * tier.slot_size
    for i in (4, 5, 6):  # each takes the other slot (evicting its predecessor), never k1's
        k = make_key(i)
        assert tier.put(k, make_payload(k, 0, 64 * 1024))
    assert check_payload(block.parts[0], 64 * 1024, k1) == 0  # untouched
    assert tier.usage().used_bytes == 2 * tier.slot_size
    with tier._lock:
        tier._unpin_locked(block)
    assert tier.usage().used_bytes == tier.slot_size


@pytest.mark.parametrize("how", ["strided", "two-dim", "float16", "longer"])
def test_buffers_of_every_shape_get_the_exact_payload(how):
    tier = MemoryTier(NS_A, 4 * MiB, pin=False)
    key = make_key(1)
    payload = make_payload(key, 1, 8192)
    assert tier.put(key, payload)
    out = {
        "strided": np.zeros(2 * 8192, np.uint8)[::2],
        "two-dim": np.zeros((2, 4096), np.uint8),
        "float16": np.zeros(4096, np.float16),
        "longer": np.zeros(8192 + 100, np.uint8),
    }[how]
    [header] = tier.get_many_into([key], [out])
    assert header is not None and header.raw_len == 8192
    got = out.view(np.uint8).reshape(-1) if out.flags.c_contiguous else out
    assert got[:8192].tobytes() == np.asarray(payload, np.uint8).tobytes()


def test_header_check_catches_a_changed_key_field():
    tier = MemoryTier(NS_A, MiB, pin=False)
    key = make_key(1)
    tier.put(key, make_payload(key, 0, 4096))
    tier.block_views(key)[0][40] ^= 1  # inside the key field
    with pytest.raises(BlockError):
        tier.get_into(key, np.zeros(4096, np.uint8))


def test_pinned_memory_needs_cuda():
    try:
        import torch
    except ImportError:
        pytest.skip("torch not installed")
    if torch.cuda.is_available():
        tier = MemoryTier(NS_A, MiB, pin=True)
        key = make_key(1)
        assert tier.put(key, make_payload(key, 0, 4096))
        assert tier.block_views(key)[0].base is not None
    else:
        with pytest.raises(ConfigError):
            MemoryTier(NS_A, MiB, pin=True)
        assert not MemoryTier(NS_A, MiB).pinned  # auto: no CUDA, plain memory


def test_unlocked_reads_never_return_a_block_whose_slot_was_refilled():
    """Readers copy without the lock while a writer replaces blocks in the same slots: every
    read returns one whole block (all bytes equal) or a miss, never a mix."""
    import threading

    size = 512 * 1024
    tier = MemoryTier(b"n" * 16, 3 * (size + 4096))  # 3 slots: replaced blocks reuse them
    keys = [bytes([i]) * 16 for i in range(2)]
    for key in keys:
        tier.put(key, np.zeros(size, np.uint8))
    stop = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        out = np.empty(size, np.uint8)
        while not stop.is_set():
            for key in keys:
                if tier.get_into(key, out) is not None and out.min() != out.max():
                    bad.append("torn")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for n in range(1, 400):
            tier.put(keys[n % 2], np.full(size, n % 251, np.uint8))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad
    assert len(tier._touched) <= 4096
    out = np.empty(size, np.uint8)
    assert tier.get_into(keys[1], out) is not None and out[0] == 399 % 251


def test_a_lent_slot_is_stored_in_place_and_stays_until_given_back():
    tier = MemoryTier(NS_A, 3 * 72 * 1024, pin=False)  # three 68 KiB slots once sized
    k1, k2 = make_key(1), make_key(2)
    assert tier.put(k2, make_payload(k2, 0, 64 * 1024))  # sizes the slots
    buf = tier.lend(64 * 1024)
    assert buf is not None and buf.nbytes == 64 * 1024 and buf.ctypes.data % 4096 == 0
    assert not tier.contains(k1)  # lent, not stored
    buf[:] = make_payload(k1, 3, 64 * 1024)
    assert tier.usage().used_bytes == 2 * tier.slot_size
    assert tier.put(k1, buf)
    stored = tier.block_views(k1)[0]
    assert stored.ctypes.data == buf.ctypes.data - 4096  # the header's page: no copy
    out = np.zeros(64 * 1024, np.uint8)
    assert tier.get_into(k1, out).raw_len == 64 * 1024
    assert check_payload(out, 64 * 1024, k1) == 3
    for i in (3, 4, 5, 6):  # the tier fills; the stored lent block is pinned: never a victim
        k = make_key(i)
        assert tier.put(k, make_payload(k, 0, 64 * 1024))
    assert tier.contains(k1)
    assert tier.unlend(buf) and not tier.unlend(buf)  # once
    assert tier.contains(k1)  # given back: an ordinary block now
    for i in (7, 8, 9):
        k = make_key(i)
        assert tier.put(k, make_payload(k, 0, 64 * 1024))
    assert not tier.contains(k1)  # evicted like any other


def test_a_lent_slot_never_stored_is_freed_and_odd_requests_are_declined():
    tier = MemoryTier(NS_A, 4 * 72 * 1024, pin=False)
    k = make_key(1)
    assert tier.put(k, make_payload(k, 0, 64 * 1024))
    used = tier.usage().used_bytes
    bufs = [tier.lend(64 * 1024) for _ in range(3)]
    assert all(b is not None for b in bufs) and tier.lend(64 * 1024) is not None  # k evicted
    assert not tier.contains(k)
    for b in bufs:
        assert tier.unlend(b)
    assert tier.usage().used_bytes == used  # the one still lent
    assert tier.lend(1 << 20) is None  # more than a slot holds
    assert not tier.unlend(np.zeros(16, np.uint8)) and not tier.unlend(b"x")
    short = tier.lend(64 * 1024)
    assert short is not None
    k2 = make_key(2)
    short[:] = make_payload(k2, 1, 64 * 1024)
    assert tier.put(k2, short[:1000])  # not the lent buffer itself: stored as a copy
    assert tier.block_views(k2)[0].ctypes.data != short.ctypes.data - 4096
    coded = MemoryTier(NS_A, 4 * 72 * 1024, pin=False, codec="kv")
    assert coded.lend(64 * 1024) is None
    tier.close()
    assert not tier.unlend(short)  # closed: nothing lent any more
