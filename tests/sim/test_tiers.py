"""A simulated tier keeps its books in the live BlockLedger: capacity, eviction, admission."""

from kvtier.sim.links import LinkQueue
from kvtier.sim.tiers import SimTier, TierSpec


def tier(**kw) -> SimTier:
    spec = TierSpec("nvme", 1e9, 0.5e9, 1e-4, **kw)
    return SimTier(spec, LinkQueue("nvme", spec.read_bandwidth, spec.latency_s))


def test_blocks_are_found_once_written_and_evicted_least_recent_first():
    t = tier(capacity_bytes=3000)
    landed = [t.offer(k, 1000, 0.0, None) for k in (b"a", b"b", b"c")]
    assert landed[0] is not None and not t.holds(b"a", 0.0) and t.holds(b"a", landed[0])
    t.read([b"a"], 1000, 1.0, None)  # "a" is now the most recently used
    assert t.offer(b"d", 1000, 1.0, None) is not None
    assert t.holds(b"a", 2.0) and not t.holds(b"b", 2.0) and t.evicted == 1
    assert t.offer(b"a", 1000, 2.0, None) is None  # held already


def test_the_codec_ratio_shrinks_what_a_block_costs_and_what_the_medium_moves():
    t = tier(capacity_bytes=3000, codec_ratio=1.5)
    for k in (b"a", b"b", b"c", b"d"):
        assert t.offer(k, 1000, 0.0, None) is not None
    assert t.ledger.usage().blocks == 4 and t.written_bytes == 4 * 666
    read = t.read([b"a"], 1500, 10.0, None)
    assert t.medium.use.bytes_moved == 4 * 666 + 1000 and read.end > 10.0


def test_admission_after_two_offers_keeps_one_hit_wonders_out():
    t = tier(capacity_bytes=10_000, admit_after=2)
    assert t.offer(b"a", 1000, 0.0, None) is None and t.refused == 1
    assert t.offer(b"a", 1000, 0.0, None) is not None


def test_a_warm_block_is_held_without_io():
    t = tier(capacity_bytes=2000)
    assert t.hold(b"a", 1000) and t.holds(b"a", 0.0) and t.medium.use.bytes_moved == 0
