"""What a lookup answers: the runs of chunks one tier holds, which loads read in one batch."""

from __future__ import annotations

from kvtier.cache.results import LookupResult


def test_runs_split_the_prefix_where_the_tier_changes():
    found = LookupResult(8, [0, 0, 1, 1, 1, 0, 2], ("dram", "disk", "s3"))
    assert list(found.runs()) == [(0, 0, 2), (1, 2, 5), (0, 5, 6), (2, 6, 7)]
    assert list(found.runs(4)) == [(0, 0, 2), (1, 2, 4)]
    assert list(LookupResult(3, [], ("dram",)).runs()) == []
