"""The short path's huge-page staging: buffers within a budget, re-cut as payloads grow."""

from __future__ import annotations

import itertools

from kvtier.specs import MiB
from kvtier.tiers.io.batch import Staging
from kvtier.tiers.io.buffers import HUGE, address


def test_buffers_fit_the_budget_and_come_back():
    staging = Staging(count=6, budget=4 * MiB)
    lent = [staging.take(slot, 300_000) for slot in range(6)]
    assert [b is not None for b in lent] == [True] * 4 + [False] * 2  # 4 buffers of 1 MiB
    assert all(b.nbytes == 300_000 for b in lent[:4])  # type: ignore[union-attr]
    starts = sorted(address(b) for b in lent[:4])  # type: ignore[arg-type]
    assert all(b - a >= MiB for a, b in itertools.pairwise(starts))  # no overlap
    assert starts[0] % HUGE == 0
    assert staging.lent(2) is lent[2] and staging.lent(5) is None
    staging.give(2)
    staging.give(5)  # a slot without a buffer: nothing to give
    assert staging.lent(2) is None
    again = staging.take(5, MiB)
    assert again is not None and address(again) == address(lent[2])  # type: ignore[arg-type]


def test_a_larger_payload_recuts_only_while_nothing_is_lent():
    staging = Staging(count=8, budget=12 * MiB)
    assert staging.take(0, 100) is not None
    assert staging.take(1, 5 * MiB + 1) is None  # buffers are lent: stays 1 MiB, goes direct
    staging.give(0)
    big = [staging.take(slot, 5 * MiB + 1) for slot in range(3)]
    assert staging.size == 6 * MiB
    assert [b is not None for b in big] == [True, True, False]  # 12 MiB holds two of 6 MiB
    assert staging.take(3, 100) is None  # smaller ones use the same buffers (none free)
    for slot in range(3):
        staging.give(slot)
    small = staging.take(4, 100)
    assert small is not None and small.nbytes == 100


def test_a_payload_over_the_budget_or_a_zero_budget_is_never_staged():
    assert Staging(count=4, budget=4 * MiB).take(0, 4 * MiB + 1) is None
    zero = Staging(count=4, budget=0)
    assert zero.take(0, 100) is None and zero.lent(0) is None
    assert Staging(count=4, budget=4 * MiB).take(0, 0) is None  # nothing to stage


def test_prepare_maps_the_buffers_for_a_payload_size_before_the_first_take():
    staging = Staging(count=4, budget=8 * MiB)
    staging.prepare(MiB + 1)  # mapped and faulted in now: 2 MiB buffers, four fit
    assert staging.size == 2 * MiB
    mapped = staging._array
    assert mapped is not None and mapped.nbytes == 8 * MiB
    lent = [staging.take(slot, MiB + 1) for slot in range(4)]
    assert all(b is not None for b in lent) and staging._array is mapped  # nothing re-mapped
    for slot in range(4):
        staging.give(slot)
    staging.prepare(100)  # smaller payloads fit the buffers there
    assert staging.size == 2 * MiB and staging._array is mapped
    Staging(count=4, budget=0).prepare(100)  # no budget: nothing to map
