"""The tier ledger, told as scenarios: what a tier's books do as blocks come, go and crowd."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.policy.eviction import make_policy
from kvtier.tiers.ledger import BlockLedger

KiB = 1024


class Medium:
    """A tier's side of the books, told by the callbacks the ledger calls: every block is a
    string entry; dropped room is freed, or kept as reusable slots when ``keeps``."""

    def __init__(self, ledger: BlockLedger, keeps: bool = False):
        self.ledger = ledger
        self.keeps = keeps
        self.kept_slots: dict[int, int] = {}  # size -> count of kept slots
        self.spilled: list[str] = []
        self.dropped: list[str] = []

    def drop(self, key: bytes, entry: str, size: int) -> None:
        self.dropped.append(entry)
        self.ledger.release(size)
        if self.keeps:
            self.kept_slots[size] = self.kept_slots.get(size, 0) + 1
            self.ledger.keep(size)

    def spill(self, key: bytes, entry: str) -> None:
        assert key in self.ledger, "a victim is spilled while still booked"
        self.spilled.append(entry)

    def reuse(self, size: int) -> str | None:
        if self.kept_slots.get(size):
            self.kept_slots[size] -= 1
            return f"slot of {size}"
        return None

    def reclaim(self) -> int:
        for size, count in self.kept_slots.items():
            if count:
                self.kept_slots[size] -= 1
                return size
        return 0

    def put(self, key: bytes, size: int, **kw) -> bool:
        ok, _ = self.ledger.make_room(
            size, self.drop, reuse=self.reuse, reclaim=self.reclaim, spill=self.spill, **kw
        )
        if ok:
            old = self.ledger.add(key, key.decode(), size)
            if old is not None:
                self.drop(key, *old)
        return ok


def test_a_tier_fills_up_then_evicts_the_least_recent_spilling_each_victim_first():
    ledger = BlockLedger(4 * KiB)
    tier = Medium(ledger)
    # Four 1 KiB blocks fill the tier exactly.
    for name in "abcd":
        assert tier.put(name.encode(), KiB)
    assert ledger.usage().used == 4 * KiB and ledger.usage().free == 0
    # Reading "a" makes "b" the oldest: a fifth block pushes "b" out, spilled first.
    ledger.touch(b"a")
    assert tier.put(b"e", KiB)
    assert tier.spilled == ["b"] and tier.dropped == ["b"]
    assert ledger.take_evicted() == [b"b"] and ledger.take_evicted() == []
    assert sorted(ledger.index) == [b"a", b"c", b"d", b"e"]
    # A 2 KiB block needs two victims, in order.
    assert tier.put(b"f", 2 * KiB)
    assert ledger.take_evicted() == [b"c", b"d"]
    assert ledger.used == 4 * KiB


def test_a_block_larger_than_the_tier_is_refused_without_evicting_anything():
    ledger = BlockLedger(4 * KiB)
    tier = Medium(ledger)
    assert tier.put(b"a", KiB)
    assert not tier.put(b"big", 5 * KiB)
    assert list(ledger.index) == [b"a"] and ledger.take_evicted() == []


def test_pinned_blocks_stay_and_the_write_fails_when_only_they_remain():
    ledger = BlockLedger(2 * KiB)
    tier = Medium(ledger)
    assert tier.put(b"a", KiB) and tier.put(b"b", KiB)
    # "a" is leased: the oldest unpinned block leaves instead.
    assert tier.put(b"c", KiB, pinned=lambda k: k == b"a")
    assert ledger.take_evicted() == [b"b"]
    # Everything pinned: no room, nothing lost, nothing reserved.
    assert not tier.put(b"d", KiB, pinned=lambda k: True)
    assert sorted(ledger.index) == [b"a", b"c"] and ledger.used == 2 * KiB


def test_kept_room_of_the_right_size_is_reused_before_anything_else():
    ledger = BlockLedger(4 * KiB)
    tier = Medium(ledger, keeps=True)
    assert tier.put(b"a", KiB) and tier.put(b"b", 2 * KiB)
    # Deleting "a" keeps its slot: the room still counts against the capacity.
    entry, size = ledger.pop(b"a")
    tier.drop(b"a", entry, size)
    assert ledger.usage().kept == KiB and ledger.usage().free == KiB
    # A 1 KiB write takes the kept slot (not the free KiB).
    ok, token = ledger.make_room(KiB, tier.drop, reuse=tier.reuse, reclaim=tier.reclaim)
    assert ok and token == f"slot of {KiB}"
    assert ledger.kept == 0 and ledger.used == 3 * KiB


def test_kept_room_of_other_sizes_is_reclaimed_before_a_block_is_evicted():
    ledger = BlockLedger(4 * KiB)
    tier = Medium(ledger, keeps=True)
    assert tier.put(b"a", KiB) and tier.put(b"b", 3 * KiB)
    entry, size = ledger.pop(b"a")
    tier.drop(b"a", entry, size)  # 1 KiB kept, 3 KiB used: full
    # A 1.5 KiB block: no kept slot of that size, no free room; the kept KiB goes back to the
    # medium first, and then "b" must go too (1 KiB alone is not enough).
    assert tier.put(b"c", 1536)
    assert ledger.take_evicted() == [b"b"]
    # "b"'s 3 KiB slot was kept when it left, and given back too: still not this size
    assert ledger.kept == 0 and tier.kept_slots == {KiB: 0, 3 * KiB: 0}
    assert ledger.used == 1536


def test_a_full_medium_lowers_the_limit_and_later_writes_evict():
    ledger = BlockLedger(100 * KiB)
    tier = Medium(ledger)
    for name in "abc":
        assert tier.put(name.encode(), KiB)
    # The filesystem filled up at 3 KiB: the ledger believes no more than that fits now.
    assert ledger.full()
    assert not ledger.full()  # already lowered
    assert ledger.limit == 3 * KiB and ledger.capacity == 100 * KiB
    assert tier.put(b"d", KiB)  # evicts instead of failing for good
    assert ledger.take_evicted() == [b"a"]
    # Room again: the limit rises, never above the capacity.
    ledger.set_limit(10**9)
    assert ledger.limit == 100 * KiB


def test_adopted_blocks_may_overfill_and_shrink_evicts_the_oldest():
    ledger = BlockLedger(2 * KiB)
    tier = Medium(ledger)
    for name in "abc":  # found on disk at open, oldest first
        ledger.adopt(name.encode(), name, KiB)
    assert ledger.used == 3 * KiB
    ledger.shrink(tier.drop)
    assert ledger.take_evicted() == [b"a"] and ledger.used == 2 * KiB


def test_replacing_a_block_hands_back_the_old_entry_still_counted():
    ledger = BlockLedger(4 * KiB)
    ledger.reserve(KiB)
    assert ledger.add(b"k", "v1", KiB) is None
    ledger.reserve(KiB)
    assert ledger.add(b"k", "v2", KiB) == ("v1", KiB)
    assert ledger.used == 2 * KiB  # the caller releases the old room when it is free
    ledger.release(KiB)
    assert ledger.usage().used == KiB and ledger.get(b"k") == "v2" and len(ledger) == 1


def test_listed_blocks_are_served_but_never_charged_or_evicted():
    ledger = BlockLedger(KiB)
    tier = Medium(ledger)
    assert ledger.show(b"theirs", "another writer's") is None
    assert b"theirs" in ledger and ledger.used == 0
    assert tier.put(b"mine", KiB)
    assert not tier.put(b"more", KiB, pinned=lambda k: k == b"mine")  # "theirs" is no victim
    assert ledger.pop(b"theirs") == ("another writer's", 0)


def test_admission_counts_puts_of_keys_not_held():
    ledger = BlockLedger.admitting_after(4 * KiB, "lru", 2)
    assert not ledger.admit(b"k", KiB)  # the first put of a key: a one-hit wonder so far
    assert ledger.admit(b"k", KiB)  # the second is admitted
    ledger.reserve(KiB)
    ledger.add(b"k", "v", KiB)
    assert ledger.admit(b"k", KiB)  # held: always
    assert BlockLedger.admitting_after(KiB, "lru", 1).admit(b"x", 1)
    with pytest.raises(ConfigError):
        BlockLedger.admitting_after(KiB, "lru", 0)
    with pytest.raises(ConfigError):
        BlockLedger(0)


def test_the_policy_sees_the_eviction_of_the_key_it_named():
    ledger = BlockLedger(2 * KiB, make_policy("arc", capacity=2))
    tier = Medium(ledger)
    assert tier.put(b"a", KiB) and tier.put(b"b", KiB) and tier.put(b"c", KiB)
    assert ledger.take_evicted() == [b"a"]
    # ARC remembers an evicted key as a ghost: its quick return counts as a wrong eviction.
    assert b"a" in ledger.policy._b1


def test_clear_forgets_everything():
    ledger = BlockLedger(2 * KiB)
    tier = Medium(ledger, keeps=True)
    assert tier.put(b"a", KiB)
    ledger.clear()
    assert ledger.usage() == type(ledger.usage())(0, 0, 2 * KiB, 2 * KiB, 0)
    assert ledger.policy.victim() is None
