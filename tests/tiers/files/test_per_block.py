"""The disk tier: conformance suite on both I/O backends, URL options, recovery, recycling."""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvtier.codec import CODECS, HEADER_SIZE, BlockMeta, CorruptBlockError
from kvtier.errors import ConfigError
from kvtier.specs import MiB
from kvtier.testing.tier_conformance import (
    NS_A,
    NS_B,
    TierConformance,
    check_payload,
    make_key,
    make_payload,
)
from kvtier.tiers import open_tier
from kvtier.tiers.files.per_block import DiskTier
from kvtier.tiers.io.backends import uring_available
from kvtier.tiers.io.buffers import PAGE, aligned_array

URING = pytest.mark.skipif(not uring_available(), reason="io_uring is not available here")


def damage(path: str, how: str, *, other: str | None = None, rng=None) -> None:
    """Damage a block file the way a bad disk, a crash or an operator would."""
    rng = rng or random.Random(0)
    size = os.path.getsize(path)
    if how in ("payload", "header"):
        with open(path, "r+b") as f:
            if how == "header":
                offset = rng.randrange(4)  # the magic
            else:
                f.seek(HEADER_SIZE + 16)  # stored length field (little-endian u64)
                stored = int.from_bytes(f.read(8)[:8], "little")
                offset = PAGE + rng.randrange(max(stored, 1))
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
    elif how == "truncate":
        os.truncate(path, size - 1000)
    elif how == "foreign":
        shutil.copyfile(other, path)
    elif how == "swap":
        tmp = path + ".swap"
        os.rename(path, tmp)
        os.rename(other, path)
        os.rename(tmp, other)
    else:
        raise ValueError(how)


class DiskConformance(TierConformance):
    io = "threads"

    def make_tier(self, root, namespace, capacity, eviction="lru"):
        return DiskTier(namespace, root / "kv", capacity, eviction=eviction, io=self.io, depth=4)

    def corrupt(self, tier, key, how, *, other_key=None, other_tier=None):
        other = None
        if how == "foreign":
            other = other_tier.block_path(key)
        elif how == "swap":
            other = tier.block_path(other_key)
        damage(tier.block_path(key), how, other=other)
        return True


class TestDiskTierThreads(DiskConformance):
    io = "threads"


@URING
class TestDiskTierUring(DiskConformance):
    io = "uring"


# --- URLs --------------------------------------------------------------------------------------
def test_url_options(tmp_path: Path):
    url = f"file://{tmp_path}/kv?size=64MiB&admit_after=2&io=threads&depth=3&sync=0&eviction=lru"
    tier = open_tier(url, NS_A)
    assert isinstance(tier, DiskTier)
    assert tier.capacity == 64 * MiB and tier.admit_after == 2 and not tier.sync
    assert tier.io.name == "threads" and tier.io.depth == 3
    assert tier.directory == tmp_path / "kv"
    assert tier.ioengine == "psync" and tier.align == 4096
    assert tier.direct  # the test disk supports O_DIRECT
    tier.close()


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?size=1MiB&io=aio",
        "?size=1MiB&depth=0",
        "?size=1MiB&depth=x",
        "?size=1MiB&admit_after=0",
        "?size=1MiB&direct=maybe",
        "?size=1MiB&colour=blue",
        "?size=1MiB&eviction=fifo",
    ],
)
def test_bad_urls(tmp_path: Path, query: str):
    with pytest.raises(ConfigError):
        open_tier(f"file://{tmp_path}{query}", NS_A)


def test_url_needs_a_local_path():
    with pytest.raises(ConfigError):
        open_tier("file://otherhost/kv?size=1MiB", NS_A)


def test_every_eviction_policy_is_accepted(tmp_path: Path):
    from kvtier.policy.eviction import POLICIES

    for name in POLICIES:
        with DiskTier(NS_A, tmp_path, MiB, eviction=name) as tier:
            assert tier.put(make_key(1), b"x" * 10)


# --- layout, buffers, codecs -------------------------------------------------------------------
def test_file_layout(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as tier:
        key = make_key(1)
        tier.put(key, make_payload(key, 0, 5000))
        path = Path(tier.block_path(key))
        assert path.parent.parent == tmp_path / NS_A.hex()
        assert path.name == key.hex() + ".kvb"
        assert path.stat().st_size == PAGE + 8192  # header page + payload in whole pages
        data = path.read_bytes()
        assert data[:4] == b"KVTB"
        assert not any(data[HEADER_SIZE:PAGE]) and not any(data[PAGE + 5000 :])


@pytest.mark.parametrize("io", ["threads", pytest.param("uring", marks=URING)])
@pytest.mark.parametrize("aligned", [True, False])
def test_aligned_and_unaligned_buffers(tmp_path: Path, io: str, aligned: bool):
    """Aligned payloads/buffers go straight to/from the device; others through scratch."""
    with DiskTier(NS_A, tmp_path, 16 * MiB, io=io) as tier:
        sizes = [PAGE * 3, PAGE * 3 + 1, 200_000, 5]
        keys = [make_key(i) for i in range(len(sizes))]
        items = []
        for k, n in zip(keys, sizes, strict=True):
            buf = aligned_array(n) if aligned else np.empty(n + 1, np.uint8)[1:]
            buf[:] = make_payload(k, 1, n)
            items.append((k, buf, BlockMeta()))
        assert tier.put_many(items) == [True] * len(items)
        outs = [
            aligned_array(n + PAGE) if aligned else np.empty(n + 3, np.uint8)[3:] for n in sizes
        ]
        for out in outs:
            out[:] = 0xEE
        results = tier.get_many_into(keys, outs)
        for k, n, res, out in zip(keys, sizes, results, outs, strict=True):
            assert res.raw_len == n
            assert np.array_equal(out[:n], make_payload(k, 1, n))
            assert (out[n:] == 0xEE).all()


class XorCodec:
    """A toy lossless codec (flips every byte) to exercise the encoded-payload paths."""

    name = "test-xor"
    id = 251

    def encode(self, raw, dtype, shape=()):
        return (np.frombuffer(raw, np.uint8) ^ 0x5A).tobytes()

    def decode_into(self, stored, out, dtype):
        n = stored.nbytes
        np.bitwise_xor(np.frombuffer(stored, np.uint8), 0x5A, out=np.frombuffer(out, np.uint8, n))
        return n


@pytest.mark.parametrize("tier_kind", ["disk", "memory"])
def test_encoded_payloads(tmp_path: Path, monkeypatch, tier_kind: str):
    monkeypatch.setitem(CODECS, XorCodec.id, XorCodec())
    from kvtier.tiers.memory import MemoryTier

    tier = (
        DiskTier(NS_A, tmp_path, 16 * MiB, codec="test-xor")
        if tier_kind == "disk"
        else MemoryTier(NS_A, 16 * MiB, slot_size=64 * 1024, pin=False, codec="test-xor")
    )
    meta = BlockMeta(codec="test-xor")
    sizes = [30, 3 * PAGE, 150_000]
    for i, n in enumerate(sizes):
        k = make_key(i)
        assert tier.put(k, make_payload(k, 2, n), meta)
    if tier_kind == "disk":  # a fresh process knows nothing of the codec: reads find out
        tier.close()
        tier = DiskTier(NS_A, tmp_path, 16 * MiB)
    for out_kind in ("aligned", "plain"):
        for i, n in enumerate(sizes):
            k = make_key(i)
            out = aligned_array(n + PAGE) if out_kind == "aligned" else np.zeros(n, np.uint8)
            header = tier.get_into(k, out)
            assert header.meta.codec == "test-xor" and header.raw_len == n
            assert check_payload(out, n, k) == 2
    tier.close()


# --- admission ---------------------------------------------------------------------------------
def test_admit_after(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB, admit_after=3) as tier:
        k = make_key(1)
        payload = make_payload(k, 0, 1000)
        assert tier.put(k, payload) is False
        assert tier.put(k, payload) is False
        assert not tier.contains(k) and not os.path.exists(tier.block_path(k))
        assert tier.put(k, payload) is True
        assert tier.put(k, payload) is True  # once held, rewrites go through
        assert tier.put_many([(make_key(2), payload, BlockMeta())]) == [False]


# --- recovery ----------------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(proc.stdout)


def test_recovery_scan(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, 4 * MiB) as tier:
        keys = [make_key(i) for i in range(5)]
        for i, k in enumerate(keys):
            tier.put(k, make_payload(k, i, 9000))
        folder = Path(tier.block_path(keys[0])).parent
    stale = folder / f"{keys[0].hex()}.{_dead_pid()}.abcdef.tmp"
    stale.write_bytes(b"half a block")
    live = folder / f"{keys[0].hex()}.{os.getpid()}.fedcba.tmp"
    live.write_bytes(b"being written")
    odd = folder / (make_key(77).hex() + ".kvb")
    odd.write_bytes(b"x" * 5000)  # not whole pages: never written by the tier
    other = folder / "README"
    other.write_text("not ours")
    with DiskTier(NS_A, tmp_path, 4 * MiB) as tier:
        assert set(tier.iter_keys()) == set(keys)
        for i, k in enumerate(keys):
            out = np.zeros(9000, np.uint8)
            assert tier.get_into(k, out) is not None
            assert check_payload(out, 9000, k) == i
        assert tier.usage().used_bytes == 5 * (PAGE + 12288)
    assert not stale.exists() and not odd.exists()
    assert live.exists() and other.exists()


def test_reopen_with_less_room_evicts_the_oldest(tmp_path: Path):
    block = PAGE + 12288
    with DiskTier(NS_A, tmp_path, 8 * block, recycle=False) as tier:
        keys = []
        for i in range(6):
            keys.append(make_key(i))
            tier.put(keys[-1], make_payload(keys[-1], i, 9000))
            t = 1_000_000_000 + i  # distinct mtimes: the scan orders by them
            os.utime(tier.block_path(keys[-1]), (t, t))
    evicted = []
    tier = DiskTier(NS_A, tmp_path, 4 * block)
    assert set(tier.iter_keys()) == set(keys[2:])
    assert tier.usage().used_bytes == 4 * block
    tier.close()
    del evicted


# --- space: recycling and the capacity bound ---------------------------------------------------
def _bytes_on_disk(tier: DiskTier) -> int:
    return sum(p.stat().st_size for p in Path(tier.root).rglob("*") if p.is_file())


def test_deleted_files_are_recycled(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as tier:
        keys = [make_key(i) for i in range(4)]
        for k in keys:
            tier.put(k, make_payload(k, 0, 20_000))
        inodes = {os.stat(tier.block_path(k)).st_ino for k in keys}
        tier.delete_many(keys[:2])
        assert tier.recycled_bytes == 2 * (PAGE + 20480)
        fresh = [make_key(10 + i) for i in range(2)]
        for k in fresh:
            tier.put(k, make_payload(k, 1, 20_000))
        assert tier.recycled_bytes == 0
        assert {os.stat(tier.block_path(k)).st_ino for k in fresh} <= inodes
        for k in fresh:
            out = np.zeros(20_000, np.uint8)
            tier.get_into(k, out)
            assert check_payload(out, 20_000, k) == 1


def test_a_file_open_by_a_reader_is_not_recycled(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as tier:
        k, fresh = make_key(1), make_key(2)
        tier.put(k, make_payload(k, 0, 20_000))
        reader = os.open(tier.block_path(k), os.O_RDONLY)  # a read in flight
        try:
            inode = os.fstat(reader).st_ino
            tier.delete(k)
            tier.put(fresh, make_payload(fresh, 0, 20_000))
            assert os.stat(tier.block_path(fresh)).st_ino != inode
            data = os.pread(reader, PAGE + 20480, 0)
            assert data[PAGE : PAGE + 20_000] == make_payload(k, 0, 20_000).tobytes()
        finally:
            os.close(reader)


def test_files_on_disk_never_exceed_capacity(tmp_path: Path):
    cap = 400_000
    rng = random.Random(7)
    with DiskTier(NS_A, tmp_path, cap) as tier:
        for step in range(150):
            k = make_key(rng.randrange(30))
            if rng.random() < 0.75:
                tier.put(k, make_payload(k, step, rng.randrange(1000, 60_000)))
            else:
                tier.delete(k)
            used = tier.usage().used_bytes
            assert used + tier.recycled_bytes <= cap
            assert _bytes_on_disk(tier) <= cap, f"step {step}"


# --- buffered fallback, other writers ----------------------------------------------------------
def test_falls_back_to_buffered_io_without_o_direct(tmp_path: Path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args, **kwargs):  # a filesystem that refuses O_DIRECT
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    with pytest.warns(RuntimeWarning, match="O_DIRECT"):
        tier = DiskTier(NS_A, tmp_path, MiB)
    assert not tier.direct
    assert any("O_DIRECT" in note for note in tier.usage().notes)
    k = make_key(1)
    assert tier.put(k, make_payload(k, 0, 7000))
    out = np.empty(7001, np.uint8)[1:]
    assert tier.get_into(k, out) is not None
    assert check_payload(out, 7000, k) == 0
    tier.close()


def test_direct_off_by_option(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB, direct=False) as tier:
        assert not tier.direct and tier.usage().notes == ()
        k = make_key(1)
        tier.put(k, make_payload(k, 0, 7000))
        out = np.zeros(7000, np.uint8)
        assert tier.get_into(k, out) is not None


def test_blocks_of_another_writer_are_served(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as reader, DiskTier(NS_A, tmp_path, MiB) as writer:
        k = make_key(1)
        writer.put(k, make_payload(k, 5, 3000))
        out = np.zeros(3000, np.uint8)
        assert reader.get_into(k, out) is not None  # read from disk, then indexed
        assert check_payload(out, 3000, k) == 5
        assert reader.usage().blocks == 1 and reader.usage().used_bytes == 2 * PAGE


def test_lookups_learn_of_blocks_other_writers_added(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as reader, DiskTier(NS_A, tmp_path, MiB) as writer:
        keys = [make_key(i) for i in range(6)]
        reader.put(keys[0], make_payload(keys[0], 0, 3000))
        for k in keys[1:3] + keys[4:]:  # keys[3] is nowhere
            writer.put(k, make_payload(k, 1, 3000))
        assert reader.contains(keys[2])
        # a prefix lookup: found up to the first key with no file anywhere
        assert reader.contains_many(keys) == [True, True, True, False, False, False]
        assert reader.usage().blocks == 3
        assert reader.contains(keys[5]) and reader.usage().blocks == 4
        writer.delete(keys[1])
        assert reader.get_into(keys[1], np.zeros(3000, np.uint8)) is None
        assert not reader.contains(keys[1])


def test_adopted_blocks_count_against_the_capacity(tmp_path: Path):
    cap = 4 * (PAGE + 4096)
    with DiskTier(NS_A, tmp_path, cap) as mine, DiskTier(NS_A, tmp_path, 4 * cap) as theirs:
        keys = [make_key(i) for i in range(8)]
        for k in keys[:4]:
            assert mine.put(k, make_payload(k, 0, 4000))
        for k in keys[4:]:
            assert theirs.put(k, make_payload(k, 1, 4000))
        assert mine.contains_many(keys[4:]) == [True] * 4
        assert mine.usage().used_bytes + mine.recycled_bytes <= cap
        assert mine.usage().blocks == 4 and set(mine.iter_keys()) == set(keys[4:])


def test_dirsync_option(tmp_path: Path):
    assert not DiskTier(NS_A, tmp_path / "a", MiB).dirsync
    tier = open_tier(f"file://{tmp_path}/b?size=1MiB&dirsync=1", NS_A)
    assert tier.dirsync
    keys = [make_key(i) for i in range(3)]
    assert all(tier.put_many([(k, make_payload(k, 0, 5000), BlockMeta()) for k in keys]))
    assert tier.put(make_key(9), make_payload(make_key(9), 0, 100))
    for k in keys:
        out = np.zeros(5000, np.uint8)
        assert tier.get_into(k, out) is not None and check_payload(out, 5000, k) == 0
    tier.close()


def test_vanished_file_is_a_miss(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as tier:
        k = make_key(1)
        tier.put(k, make_payload(k, 0, 3000))
        os.unlink(tier.block_path(k))
        assert tier.get_into(k, np.zeros(3000, np.uint8)) is None
        assert not tier.contains(k) and tier.usage().used_bytes == 0


def test_page_truncation_is_detected(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as tier:
        k = make_key(1)
        tier.put(k, make_payload(k, 0, 3 * PAGE + 10))
        path = tier.block_path(k)
        for size in (4 * PAGE, 3 * PAGE, PAGE, 0):
            os.truncate(path, size)
            with pytest.raises(CorruptBlockError):
                tier.get_into(k, np.zeros(3 * PAGE + 10, np.uint8))


def test_namespaces_live_in_separate_directories(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as a, DiskTier(NS_B, tmp_path, MiB) as b:
        k = make_key(1)
        a.put(k, b"a" * 100)
        b.put(k, b"b" * 100)
        assert a.block_path(k) != b.block_path(k)
        assert a.usage().blocks == b.usage().blocks == 1


def test_a_block_rewritten_at_another_size_by_another_writer(tmp_path: Path):
    with DiskTier(NS_A, tmp_path, MiB) as mine, DiskTier(NS_A, tmp_path, MiB) as theirs:
        k = make_key(1)
        mine.put(k, make_payload(k, 1, 5000))  # indexed here with its file size
        for version, n in ((2, 30_000), (3, 100)):
            theirs.put(k, make_payload(k, version, n))
            out = np.zeros(30_000, np.uint8)
            header = mine.get_into(k, out)
            assert header.raw_len == n
            assert check_payload(out, n, k) == version


def test_kept_files_survive_a_reopen_and_are_not_shared_while_open(tmp_path: Path):
    k = [make_key(i) for i in range(4)]
    with DiskTier(NS_A, tmp_path, MiB) as first:
        for key in k:
            first.put(key, make_payload(key, 0, 20_000))
        first.delete_many(k[:2])
        kept = first.recycled_bytes
        assert kept == 2 * (PAGE + 20480)
        with DiskTier(NS_A, tmp_path, MiB) as second:  # first is still open: nothing to adopt
            assert second.recycled_bytes == 0
            for i in (10, 11):  # both write and delete side by side: never the same file
                for tier in (first, second):
                    key = make_key(i)
                    assert tier.put(key, make_payload(key, i, 20_000))
                    out = np.zeros(20_000, np.uint8)
                    assert tier.get_into(key, out) is not None
                    assert check_payload(out, 20_000, key) == i
                    tier.delete(key)
            kept += second.recycled_bytes
    with DiskTier(NS_A, tmp_path, MiB) as again:  # both closed: their kept files are adopted
        assert again.recycled_bytes == kept
        assert _bytes_on_disk(again) == again.usage().used_bytes + kept
