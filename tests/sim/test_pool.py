"""The engine's paged pool: prefix hits by chained key, LRU reuse of freed blocks, tail first."""

from kvtier.sim.pool import EnginePool


def test_freed_blocks_stay_findable_until_handed_out_again():
    pool = EnginePool(4, 16)
    blocks = pool.allocate(3)
    for b, key in zip(blocks, (b"a", b"b", b"c"), strict=True):
        pool.register(b, key)
    pool.release(blocks)
    assert pool.free_count() == 4 and pool.lookup([b"a", b"b", b"c"], 10) == 3
    assert pool.lookup([b"a", b"x", b"c"], 10) == 1
    assert pool.lookup([b"a", b"b", b"c"], 2) == 2  # the cap (a prompt keeps a token to compute)
    # a new request takes the never-used block first, then the freed tail ("c") before the head
    pool.allocate(2)
    assert pool.lookup([b"a", b"b", b"c"], 10) == 2 and pool.evicted == 1


def test_held_blocks_are_shared_and_cannot_be_allocated():
    pool = EnginePool(2, 16)
    (b,) = pool.allocate(1)
    pool.register(b, b"k")
    assert pool.take_cached([b"k"]) == [b] and pool.ref[b] == 2
    assert pool.allocate(2) is None and pool.free_count() == 1
    pool.release([b])
    pool.release([b])
    assert pool.reusable_free([b"k"]) == 1
