"""Eviction policies, driven the way a tier drives them: insert on put, touch on hit,
victim + remove when room is needed."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.policy.eviction import ARC, LRU, CostAware, make_policy

NAMES = ["lru", "arc", "cost"]


def k(i: int) -> bytes:
    return i.to_bytes(16, "little")


class BlockCounter:
    """A tier's bookkeeping reduced to what a policy sees: a bounded set of held keys."""

    def __init__(self, policy, capacity: int, pinned=None):
        self.policy, self.capacity, self.pinned = policy, capacity, pinned
        self.held: set[bytes] = set()
        self.hits = 0
        self.evicted: list[bytes] = []

    def access(self, key: bytes, size: int = 1, value: float = 0.0) -> bool:
        if key in self.held:
            self.hits += 1
            self.policy.touch(key)
            return True
        while len(self.held) >= self.capacity:
            victim = self.policy.victim(self.pinned)
            if victim is None:
                return False
            self.policy.remove(victim)
            self.held.discard(victim)
            self.evicted.append(victim)
        self.policy.insert(key, size, value)
        self.held.add(key)
        return False


@pytest.mark.parametrize("name", NAMES)
def test_common_contract(name):
    policy = make_policy(name)
    assert len(policy) == 0 and policy.victim() is None
    for i in range(4):
        policy.insert(k(i), 100, 1.0)
    assert len(policy) == 4
    first = policy.victim()
    assert first is not None and policy.victim() == first and len(policy) == 4  # names, no removal
    policy.remove(k(99))  # not held: nothing happens
    policy.touch(k(99))
    assert len(policy) == 4
    for _ in range(4):
        victim = policy.victim()
        policy.remove(victim)
    assert len(policy) == 0 and policy.victim() is None


@pytest.mark.parametrize("name", NAMES)
def test_pinned_keys_are_never_named(name):
    policy = make_policy(name)
    for i in range(5):
        policy.insert(k(i), 100)
    pinned = {k(0), k(1)}
    cache = BlockCounter(policy, capacity=5, pinned=pinned.__contains__)
    cache.held = {k(i) for i in range(5)}
    for i in range(5, 30):
        cache.access(k(i))
    assert pinned <= cache.held
    assert not pinned & set(cache.evicted)
    everything = {*cache.held}
    assert policy.victim(everything.__contains__) is None


@pytest.mark.parametrize("name", NAMES)
def test_recently_touched_block_outlives_an_untouched_one(name):
    cache = BlockCounter(make_policy(name), capacity=3)
    for i in range(3):
        cache.access(k(i))
    cache.access(k(0))  # a hit
    cache.access(k(3))  # needs room
    assert k(0) in cache.held and k(1) not in cache.held


@pytest.mark.parametrize("name", NAMES)
def test_touch_many_is_touch_in_order(name):
    rng = random.Random(7)
    one, many = make_policy(name), make_policy(name)
    for policy in (one, many):
        for i in range(20):
            policy.insert(k(i), 100 + i, float(i % 3))
    reads = [k(rng.randrange(25)) for _ in range(60)]  # some keys it does not hold
    for key in reads:
        one.touch(key)
    many.touch_many(iter(reads))
    for _ in range(20):  # the same victims, in the same order
        victim = one.victim()
        assert many.victim() == victim
        one.remove(victim)
        many.remove(victim)


def test_lru_evicts_in_order_of_last_use():
    cache = BlockCounter(LRU(), capacity=3)
    for i in (1, 2, 3, 1, 4, 5):
        cache.access(k(i))
    assert cache.evicted == [k(2), k(3)]


def test_arc_keeps_a_reused_working_set_through_a_scan_where_lru_loses_it():
    """Eight hot blocks read twice, then a long one-off scan, then the hot set again."""
    hot = [k(i) for i in range(8)]
    scan = [k(1000 + i) for i in range(40)]
    trace = hot + hot + scan + hot
    results = {}
    for name in ("lru", "arc"):
        cache = BlockCounter(make_policy(name), capacity=12)
        for key in trace[:-8]:
            cache.access(key)
        before = cache.hits
        for key in hot:
            cache.access(key)
        results[name] = cache.hits - before
    assert results["lru"] == 0
    assert results["arc"] == 8


def test_arc_ghost_hit_moves_its_target_towards_recency():
    arc = ARC(capacity=4)
    cache = BlockCounter(arc, capacity=4)
    for i in range(6):  # 0 and 1 are evicted from T1 and leave ghosts
        cache.access(k(i))
    assert arc.p == 0
    cache.access(k(0))  # back from the B1 ghost list
    assert arc.p > 0


def test_arc_ghost_lists_stay_bounded():
    arc = ARC(capacity=8)
    cache = BlockCounter(arc, capacity=8)
    for i in range(1000):
        cache.access(k(i))
    assert len(arc._b1) + len(arc._b2) <= 8 and len(arc) == 8


def test_arc_plain_delete_leaves_no_ghost():
    arc = ARC(capacity=4)
    arc.insert(k(1), 1)
    arc.remove(k(1))  # not named by victim(): a delete, not an eviction
    arc.insert(k(1), 1)
    assert arc.p == 0 and k(1) in arc._t1


def test_cost_aware_evicts_fewest_seconds_saved_per_byte():
    policy = CostAware()
    policy.insert(k(1), size=1000, value=1.0)  # 1 ms per kB
    policy.insert(k(2), size=100, value=1.0)  # 10 ms per kB
    policy.insert(k(3), size=1000, value=0.1)  # 0.1 ms per kB
    order = []
    while (victim := policy.victim()) is not None:
        order.append(victim)
        policy.remove(victim)
    assert order == [k(3), k(1), k(2)]


def test_cost_aware_ties_go_to_the_least_recently_used():
    policy = CostAware()
    for i in range(3):
        policy.insert(k(i), 10, 1.0)
    policy.touch(k(0))
    assert policy.victim() == k(1)


def test_cost_aware_ages_out_a_valuable_block_that_is_never_read_again():
    """A block worth 10x its neighbours still leaves once enough evictions raised the clock."""
    cache = BlockCounter(CostAware(), capacity=4)
    cache.access(k(0), size=1, value=10.0)
    for i in range(1, 200):
        cache.access(k(i), size=1, value=1.0)
        if k(0) not in cache.held:
            break
    assert k(0) not in cache.held
    assert 5 < i < 100  # it survived a while, then aged out


def test_cost_aware_clock_only_moves_on_evictions():
    policy = CostAware()
    policy.insert(k(1), 1, 5.0)
    policy.insert(k(2), 1, 3.0)
    policy.remove(k(1))  # a delete
    assert policy.clock == 0
    assert policy.victim() == k(2)
    policy.remove(k(2))  # the eviction of the named victim
    assert policy.clock == pytest.approx(3.0)
    policy.insert(k(3), 1, 1.0)
    assert policy.priority(k(3)) == pytest.approx(4.0)


def test_cost_aware_refuses_negative_values():
    with pytest.raises(ValueError):
        CostAware().insert(k(1), 1, -1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=300), st.integers(1, 10))
def test_cost_aware_without_values_behaves_like_lru(trace, capacity):
    lru, cost = BlockCounter(LRU(), capacity), BlockCounter(CostAware(), capacity)
    for i in trace:
        lru.access(k(i))
        cost.access(k(i))
    assert cost.evicted == lru.evicted


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(NAMES), st.lists(st.integers(0, 50), max_size=400), st.integers(1, 12))
def test_bookkeeping_matches_the_held_set(name, trace, capacity):
    policy = make_policy(name)
    cache = BlockCounter(policy, capacity)
    rng = random.Random(len(trace))
    for i in trace:
        cache.access(k(i), size=rng.randint(1, 8), value=rng.random())
        assert len(policy) == len(cache.held) <= capacity


def test_make_policy_by_name():
    assert isinstance(make_policy("LRU"), LRU)
    assert isinstance(make_policy("arc", capacity=16), ARC)
    assert isinstance(make_policy("cost-aware"), CostAware)
    with pytest.raises(ConfigError, match="lru"):
        make_policy("mru")
