"""What operators hit with file tiers: a filesystem that fills up before ``size=``, inodes that
run out, many block sizes in a small slab tier, and values that cannot work. Real files on real,
loop-mounted filesystems."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvtier.codec import BlockMeta
from kvtier.errors import ConfigError, TierPathError
from kvtier.keys import Namespace
from kvtier.testing.mounts import loop_mount, require_loop_mounts
from kvtier.testing.tier_conformance import check_payload, make_key, make_payload
from kvtier.tiers import open_tier
from kvtier.tiers.files.per_block import DiskTier
from kvtier.tiers.files.slab import SlabTier
from kvtier.tiers.ledger import BlockLedger
from kvtier.tiers.memory.tier import MemoryTier

NS = Namespace("m", "f", "bf16", 1, 1, 1).id
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BLOCK = 256 * KiB


def _fill(tier, keys: list[bytes]) -> list[bool]:
    return [tier.put(k, make_payload(k, 1, BLOCK), BlockMeta()) for k in keys]


def _readable(tier, key: bytes) -> bool:
    out = np.zeros(BLOCK, np.uint8)
    got = tier.get_many_into([key], [out])[0]
    return got is not None and not isinstance(got, Exception) and check_payload(out, BLOCK, key)


FULL = "ignore:.*filled up before size=:RuntimeWarning"  # the note each test checks for


@pytest.mark.filterwarnings(FULL)
@pytest.mark.parametrize("scheme", ["file", "slab"])
def test_a_filesystem_full_before_size_makes_the_tier_evict(scheme):
    require_loop_mounts()
    with loop_mount(24 * MiB, mkfs_options=("-m", "0")) as mnt:
        tier = open_tier(f"{scheme}://{mnt}?size=1GiB&io=threads", NS)
        try:
            keys = [make_key(i) for i in range(200)]  # 50 MiB of blocks into ~22 MiB
            first = _fill(tier, keys[:120])
            assert not all(first), "the filesystem never filled up"
            usage = tier.usage()
            assert any("filled up before size=" in n for n in usage.notes), usage.notes
            assert tier.ledger.limit < tier.ledger.capacity
            # From now on puts evict to make room, as they would at size=.
            later = _fill(tier, keys[120:])
            assert sum(later) >= len(later) - 2, later
            assert all(_readable(tier, k) for k in keys[-5:])
            assert tier.usage().used_bytes <= tier.ledger.limit
        finally:
            tier.close()


@pytest.mark.filterwarnings(FULL)
def test_running_out_of_inodes_makes_the_per_block_tier_evict():
    require_loop_mounts()
    with (
        loop_mount(64 * MiB, inodes=64, mkfs_options=("-m", "0")) as mnt,
        DiskTier(NS, mnt, GiB, io="threads", recycle=False) as tier,
    ):
        # one folder of block files (a running tier has made all 256 long before)
        keys = [b"\x11" + make_key(i)[1:] for i in range(150)]
        _fill(tier, keys[:100])
        # the inodes ran out: the tier evicted (within the same puts) to keep storing
        assert tier.contains_many(keys[:100]).count(True) < 100, "inodes never ran out"
        assert any("filled up before size=" in n for n in tier.usage().notes)
        later = _fill(tier, keys[100:])
        assert sum(later) >= len(later) - 2, later
        assert all(_readable(tier, k) for k in keys[-5:])


@pytest.mark.filterwarnings(FULL)
@pytest.mark.parametrize("scheme", ["file", "slab"])
def test_a_tier_out_of_inodes_keeps_storing_new_blocks_in_new_folders(scheme):
    """Blocks spread over every block folder (the defaults, file reuse on): once the inodes run
    out, new blocks still go in, evicting old ones, and deleting blocks makes room again."""
    require_loop_mounts()
    with loop_mount(64 * MiB, inodes=64, mkfs_options=("-m", "0")) as mnt:
        tier = open_tier(f"{scheme}://{mnt}?size=1GiB&io=threads", NS)
        try:
            keys = [make_key(i) for i in range(250)]
            _fill(tier, keys[:100])
            assert sum(_fill(tier, keys[100:132])) == 32
            assert all(_readable(tier, k) for k in keys[127:132])
            for key in keys[100:110]:
                tier.delete(key)
            assert sum(_fill(tier, keys[200:210])) == 10
            assert all(_readable(tier, k) for k in keys[200:210])
        finally:
            tier.close()


def test_many_block_sizes_keep_a_small_slab_tier_near_its_size(tmp_path):
    size = 6 * MiB
    with SlabTier(NS, tmp_path, size, io="threads") as tier:
        for i in range(23):  # 23 size classes, each its own slab file
            n = 20 * KiB + i * 9 * KiB
            key = make_key(i)
            assert tier.put(key, make_payload(key, 1, n), BlockMeta())
        usage = tier.usage()
        assert usage.used_bytes <= size
        assert usage.footprint_bytes is not None
        assert usage.footprint_bytes <= 1.25 * size, usage.footprint_bytes
        assert tier.file_bytes <= 1.25 * size, tier.file_bytes


def test_every_tier_keeps_its_books_in_a_ledger(tmp_path):
    tiers = [
        MemoryTier(NS, 4 * MiB, pin=False),
        open_tier(f"file://{tmp_path / 'f'}?size=8MiB", NS),
        open_tier(f"slab://{tmp_path / 's'}?size=8MiB", NS),
    ]
    try:
        for tier in tiers:
            assert isinstance(tier.ledger, BlockLedger), tier
            key = make_key(7)
            assert tier.put(key, make_payload(key, 1, 20_000), BlockMeta())
            assert key in tier.ledger and tier.ledger.used == tier.usage().used_bytes > 0
            assert tier.ledger.index is tier._index  # the read path looks keys up there
    finally:
        for tier in tiers:
            tier.close()


def test_values_that_cannot_work_are_refused_at_open(tmp_path):
    with pytest.raises(ConfigError, match="larger than size"):
        open_tier(f"slab://{tmp_path}?size=1MiB&slot=2MiB", NS)
    with pytest.raises(ConfigError, match="larger than size"):
        open_tier("memory://?size=1MiB&slot=2MiB", NS)
    for bad in ("nan", "-1", "inf"):
        with pytest.raises(ConfigError, match="rescan"):
            open_tier(f"slab://{tmp_path}?size=1MiB&rescan={bad}", NS)
    with pytest.raises(ConfigError, match="rescan"):
        SlabTier(NS, tmp_path, MiB, rescan=math.nan)
    with pytest.raises(ConfigError, match="larger than size"):
        SlabTier(NS, tmp_path, MiB, 2 * MiB)
    with pytest.raises(ConfigError, match="more than this host's RAM"):
        MemoryTier(NS, 1 << 60, pin=False)


def test_staging_beyond_the_tier_is_clamped_with_a_note(tmp_path):
    with pytest.warns(RuntimeWarning, match="staging"):
        tier = open_tier(f"slab://{tmp_path}?size=8MiB&staging=64MiB", NS)
    with tier:
        assert tier.staging == 8 * MiB
        assert any("staging=" in n and "tier's size" in n for n in tier.usage().notes)
    with open_tier(f"slab://{tmp_path}?size=8MiB", NS) as quiet:  # the default: no note
        assert quiet.staging == 8 * MiB and quiet.usage().notes == ()


@pytest.mark.parametrize("cls", [DiskTier, SlabTier])
def test_an_unusable_directory_is_a_clear_error_from_the_constructor(tmp_path, cls):
    file = tmp_path / "a-file"
    file.write_bytes(b"x")
    for bad, reason in ((file, "not-a-directory"), (file / "kv", "not-a-directory")):
        with pytest.raises(TierPathError) as err:
            cls(NS, bad, MiB)
        assert err.value.reason == reason and str(file) in str(err.value)
    with pytest.raises(TierPathError) as err:
        cls(NS, "/proc/kvtier", MiB)
    assert err.value.reason == "pseudo-fs"
