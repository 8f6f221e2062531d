"""The memory arena: slots handed out and taken back exactly once, a block of several slots in
one run of consecutive ones whenever a free run is long enough."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.tiers.memory.arena import CHUNK_BYTES, SlabArena

SLOT = 1 << 20  # 64 slots a chunk


def _consecutive(slots) -> bool:
    return list(slots) == list(range(slots[0], slots[0] + len(slots)))


def test_a_block_of_several_slots_takes_one_run_and_reuses_the_run_the_last_one_freed():
    arena = SlabArena(4 * CHUNK_BYTES, SLOT)
    blocks = [arena.alloc(17) for _ in range(10)]
    assert all(b is not None and _consecutive(b) for b in blocks)
    assert all(arena.span(b) is not None for b in blocks)
    arena.free(blocks[3])
    again = arena.alloc(17)
    assert again == blocks[3]  # the freed run, taken whole


def test_the_smallest_run_that_fits_is_taken_and_long_runs_stay_whole():
    arena = SlabArena(CHUNK_BYTES, SLOT)
    ones = [arena.alloc(1) for _ in range(64)]
    arena.free([s for [s] in ones[0:10]])  # a run of 10
    arena.free([s for [s] in ones[20:24]])  # a run of 4
    arena.free([s for [s] in ones[30:31]])  # a single slot freed last: on top of the stack
    got = arena.alloc(3)
    assert list(got) == [20, 21, 22]
    assert list(arena.alloc(9)) == list(range(0, 9))


def test_without_a_long_enough_run_a_block_takes_any_free_slots():
    arena = SlabArena(CHUNK_BYTES, SLOT)
    ones = [arena.alloc(1) for _ in range(64)]
    freed = [s for [s] in ones[::2]]  # every other slot: no run of two
    arena.free(freed)
    got = arena.alloc(5)
    assert got is not None and len(set(got)) == 5 and set(got) <= set(freed)
    assert arena.span(got) is None


@pytest.mark.parametrize("seed", range(4))
def test_under_churn_no_slot_is_handed_out_twice_and_the_counts_hold(seed):
    rng = np.random.default_rng(seed)
    arena = SlabArena(3 * CHUNK_BYTES + 5 * SLOT, SLOT)  # a partial last chunk
    held: list = []
    for _ in range(2000):
        if held and (rng.random() < 0.45 or arena.free_slots < 20):
            arena.free(held.pop(int(rng.integers(len(held)))))
        else:
            got = arena.alloc(int(rng.choice([1, 2, 7, 17])))
            if got is not None:
                held.append(got)
        taken = [s for b in held for s in b]
        assert len(taken) == len(set(taken)) == arena.held_slots
        assert all(0 <= s < arena.slots for s in taken)
        assert arena.free_slots == arena.slots - len(taken)
    assert arena.alloc(arena.free_slots + 1) is None
