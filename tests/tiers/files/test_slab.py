"""The slab tier: conformance suite, URL options, recovery, kill -9, damage, two processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvtier.codec import HEADER_SIZE, BlockError, BlockMeta
from kvtier.errors import ConfigError
from kvtier.specs import MiB
from kvtier.testing.tier_conformance import (
    NS_A,
    TierConformance,
    check_payload,
    kill_mid_burst,
    make_key,
    make_payload,
    read_all_blocks,
    wait_lines,
)
from kvtier.tiers import open_tier
from kvtier.tiers.files.slab import CLEAN, SlabTier
from kvtier.tiers.io.backends import uring_available
from kvtier.tiers.io.buffers import PAGE, align_up, aligned_array

URING = pytest.mark.skipif(not uring_available(), reason="io_uring is not available here")


def _slot(tier: SlabTier, key: bytes) -> tuple[str, int, int]:
    """(file path, slot offset, bytes the block spans) of an indexed block."""
    entry = tier._index[key]
    return entry.file.path, entry.offset, PAGE + align_up(entry.header.stored_len)


def _exchange(path_a: str, off_a: int, path_b: str, off_b: int, n: int, both: bool) -> None:
    with open(path_a, "r+b") as fa, open(path_b, "r+b") as fb:
        fa.seek(off_a)
        a = fa.read(n)
        fb.seek(off_b)
        b = fb.read(n)
        fa.seek(off_a)
        fa.write(b)
        if both:
            fb.seek(off_b)
            fb.write(a)


def _flip(path: str, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


class SlabConformance(TierConformance):
    io = "threads"
    direct: bool | None = None

    def make_tier(self, root, namespace, capacity, eviction="lru"):
        return SlabTier(
            namespace, root / "kv", capacity, eviction=eviction, io=self.io, depth=4,
            direct=self.direct,
        )  # fmt: skip

    def corrupt(self, tier, key, how, *, other_key=None, other_tier=None):
        path, offset, n = _slot(tier, key)
        if how == "payload":
            stored = tier._index[key].header.stored_len
            _flip(path, offset + PAGE + random.Random(0).randrange(stored), 3)
        elif how == "header":
            _flip(path, offset + 1, 4)  # the magic
        elif how == "foreign":
            other_path, other_offset, _ = _slot(other_tier, key)
            _exchange(path, offset, other_path, other_offset, n, both=False)
        elif how == "swap":
            other_path, other_offset, _ = _slot(tier, other_key)
            _exchange(path, offset, other_path, other_offset, n, both=True)
        else:  # truncating a slab cuts every later slot too: see test_truncation_*
            return False
        return True


class TestSlabTierThreads(SlabConformance):
    io = "threads"


@URING
class TestSlabTierUring(SlabConformance):
    io = "uring"


@URING
class TestSlabTierUringBuffered(SlabConformance):
    io = "uring"
    direct = False


# --- URLs --------------------------------------------------------------------------------------
def test_url_options(tmp_path: Path):
    url = f"slab://{tmp_path}/kv?size=64MiB&slot=260KiB&admit_after=2&io=threads&depth=3&sync=0"
    tier = open_tier(url, NS_A)
    try:
        assert isinstance(tier, SlabTier)
        assert tier.capacity == 64 * MiB and tier.admit_after == 2 and not tier.sync
        assert tier.min_slot == 260 * 1024 and tier.io.depth == 3 and tier.ioengine == "psync"
        assert tier.directory == tmp_path / "kv"
        key = make_key(1)
        payload = make_payload(key, 1, 1000)
        assert tier.put(key, payload) is False  # first sight: not admitted
        assert tier.put(key, payload) is True
        assert tier.usage().used_bytes == 260 * 1024  # small blocks take the slot= class
    finally:
        tier.close()


@pytest.mark.parametrize(
    "url",
    [
        "slab:///x",
        "slab://host/x?size=1MiB",
        "slab:///x?size=1MiB&bogus=1",
        "slab:///x?size=1MiB&rescan=a",
    ],
)
def test_bad_urls(url: str):
    with pytest.raises(ConfigError):
        open_tier(url, NS_A)


# --- recovery ----------------------------------------------------------------------------------
def _items(keys, version: int, sizes) -> list:
    return [(k, make_payload(k, version, n), BlockMeta()) for k, n in zip(keys, sizes, strict=True)]


def test_reopen_recovers_the_index_bit_exact(tmp_path: Path):
    keys = [make_key(i) for i in range(30)]
    sizes = [20_000 if i % 3 else 9_000 for i in range(30)]
    with SlabTier(NS_A, tmp_path, 8 * MiB, depth=4) as tier:
        assert all(tier.put_many(_items(keys, 1, sizes)))
        assert all(tier.put_many(_items(keys[:10], 2, sizes[:10])))  # overwrites: new slots
        for k in keys[25:]:
            assert tier.delete(k)
        before = {k: (e.head, e.header) for k, e in tier._index.items()}
        used = tier.usage().used_bytes
    with SlabTier(NS_A, tmp_path, 8 * MiB, depth=4) as again:
        assert {k: (e.head, e.header) for k, e in again._index.items()} == before
        assert again.usage().used_bytes == used
        for i, k in enumerate(keys[:25]):
            out = np.zeros(sizes[i], np.uint8)
            assert again.get_into(k, out) is not None
            assert check_payload(out, sizes[i], k) == (2 if i < 10 else 1)
        assert not any(again.contains(k) for k in keys[25:])


@URING
@pytest.mark.parametrize("budget", [96 * MiB, 3 * MiB, 0])
def test_blocks_staged_or_direct_round_trip_bit_exact(tmp_path: Path, budget: int):
    # budget 96 MiB: every payload staged (buffers re-cut as sizes grow); 3 MiB: the ones that
    # fit while a buffer is free; 0: none. Sizes straddle the 1 MiB unit and the page.
    sizes = [MiB - PAGE + 100, MiB, MiB + 100, MiB + PAGE, 300_000, 5 * MiB + 100, 2 * MiB]
    keys = [make_key(i) for i in range(len(sizes))]
    with SlabTier(NS_A, tmp_path, 128 * MiB, io="uring", depth=2, staging=budget) as tier:
        assert all(tier.put_many(_items(keys, 1, sizes)))  # staged and direct writes
        outs = [aligned_array(n) for n in sizes]
        got = tier.get_many_into(keys, outs)  # staged and direct reads, one batch
        assert all(h is not None and not isinstance(h, Exception) for h in got)
        for k, n, out in zip(keys, sizes, outs, strict=True):
            assert check_payload(out, n, k) == 1
        for i in (1, 5):  # a damaged payload, staged or not: an error, not data
            path, offset, _ = _slot(tier, keys[i])
            _flip(path, offset + PAGE + 5000 + i, 0)
    with SlabTier(NS_A, tmp_path, 128 * MiB, io="uring", depth=2, staging=budget) as again:
        outs = [aligned_array(n) for n in sizes]
        got = again.get_many_into(keys, outs)
        assert isinstance(got[1], BlockError) and isinstance(got[5], BlockError)
        for i in (0, 2, 3, 4, 6):
            assert check_payload(outs[i], sizes[i], keys[i]) == 1


@URING
def test_warm_io_maps_the_rings_staging_so_reads_and_writes_map_nothing(tmp_path: Path):
    block = MiB + 100
    with SlabTier(NS_A, tmp_path, 64 * MiB, io="uring", depth=2, staging=8 * MiB) as tier:
        tier.warm_io(block, 2)
        rings = list(tier.io._free)
        assert len(rings) == 2
        arrays = [ring.short_slots.staging._array for ring in rings]
        assert all(a is not None and a.nbytes == 8 * MiB for a in arrays)  # four of 2 MiB
        keys = [make_key(i) for i in range(6)]
        assert all(tier.put_many(_items(keys, 1, [block] * 6)))
        outs = [aligned_array(block) for _ in keys]
        got = tier.get_many_into(keys, outs)
        assert all(h is not None and not isinstance(h, Exception) for h in got)
        for key, out in zip(keys, outs, strict=True):
            assert check_payload(out, block, key) == 1
        after = [ring.short_slots.staging._array for ring in tier.io._free]
        assert all(any(a is b for b in arrays) for a in after)  # the warmed buffers served
    with SlabTier(NS_A, tmp_path / "t", 64 * MiB, io="threads") as threads:
        threads.warm_io(block, 2)  # no rings: nothing to warm, nothing fails


WRITER = r"""
import sys
from kvtier.codec import BlockMeta
from kvtier.testing.tier_conformance import NS_A, make_key, make_payload
from kvtier.tiers.files.slab import SlabTier

root, keys, seed, io = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tier = SlabTier(NS_A, root, 2 << 20, io=io, depth=4, rescan=0.01)
step = 0
while True:
    batch = []
    for j in range(4):
        i = (step * 4 + j + seed) % keys
        k = make_key(i)
        batch.append((k, make_payload(k, seed * 1_000_000 + step, 24_000 + (i % 3) * 5_000),
                      BlockMeta()))
    tier.put_many(batch)
    if step % 7 == 3:
        tier.delete(make_key((step + seed) % keys))
    print(step, flush=True)
    step += 1
"""


def _start_writer(root: Path, keys: int, seed: int, io: str = "auto") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(keys), str(seed), io],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_kill_9_during_a_burst_leaves_only_whole_blocks(tmp_path: Path):
    rng = random.Random(7)
    recovered = 0
    for round_ in range(3):
        proc = _start_writer(tmp_path, 60, round_)
        kill_mid_burst(proc, rng.randrange(3, 30), rng.random() * 0.02)
        files = list(Path(tmp_path, NS_A.hex()).glob("*.slab"))
        assert files and not any(Path(str(f) + CLEAN).exists() for f in files)
        with SlabTier(NS_A, tmp_path, 2 << 20) as tier:  # adopts the dead writer's files
            recovered = read_all_blocks(tier, 64_000)
            assert recovered == tier.usage().blocks
            assert tier.usage().used_bytes <= tier.capacity
    assert recovered > 0


# --- damage ------------------------------------------------------------------------------------
def test_random_bit_flips_are_detected(tmp_path: Path):
    n = 3 * PAGE + 700
    rng = random.Random(5)
    with SlabTier(NS_A, tmp_path, 1 * MiB) as tier:
        keys = [make_key(i) for i in range(3)]
        for k in keys:
            assert tier.put(k, make_payload(k, 1, n))
        key = keys[1]
        path, offset, span = _slot(tier, key)
        pristine = Path(path).read_bytes()
        meaningful = [(offset, offset + HEADER_SIZE), (offset + PAGE, offset + PAGE + n)]
        detected = 0
        for _ in range(150):
            at = offset + rng.randrange(span)
            bit = rng.randrange(8)
            _flip(path, at, bit)
            out = np.zeros(n, np.uint8)
            try:
                header = tier.get_into(key, out)
            except BlockError:
                detected += 1
            else:
                assert header is not None
                assert not any(a <= at < b for a, b in meaningful), f"flip at {at} served"
                check_payload(out, n, key)
            _flip(path, at, bit)  # undo
        assert detected > 100
        assert Path(path).read_bytes() == pristine
        for k in (keys[0], keys[2]):
            check_payload(_get(tier, k, n), n, k)
        # flips that stay: after a reopen, a bad header is not indexed, a bad payload is an error
        _flip(path, offset + 2, 1)
        _flip(path, _slot(tier, keys[2])[1] + PAGE + 10, 1)
    with SlabTier(NS_A, tmp_path, 1 * MiB) as again:
        assert not again.contains(keys[1])
        with pytest.raises(BlockError):
            again.get_into(keys[2], np.zeros(n, np.uint8))
        check_payload(_get(again, keys[0], n), n, keys[0])


def _get(tier: SlabTier, key: bytes, n: int) -> np.ndarray:
    out = np.zeros(n, np.uint8)
    assert tier.get_into(key, out) is not None
    return out


@pytest.mark.parametrize("cut_seed", [1, 2, 3])
def test_truncation_of_the_slab_is_detected(tmp_path: Path, cut_seed: int):
    n = 2 * PAGE + 300
    keys = [make_key(i) for i in range(8)]
    with SlabTier(NS_A, tmp_path, 1 * MiB, io="threads") as tier:
        assert all(tier.put_many(_items(keys, 1, [n] * len(keys))))
        path = _slot(tier, keys[0])[0]
        spans = {k: _slot(tier, k)[1:] for k in keys}
        cut = random.Random(cut_seed).randrange(max(o + s for o, s in spans.values()))
        os.truncate(path, cut)
        for k in keys:
            out = np.zeros(n, np.uint8)
            whole = spans[k][0] + spans[k][1] <= cut
            try:
                header = tier.get_into(k, out)
            except BlockError:
                assert not whole
                continue
            assert header is not None and whole
            check_payload(out, n, k)
    with SlabTier(NS_A, tmp_path, 1 * MiB, io="threads") as again:
        for k in keys:
            out = np.zeros(n, np.uint8)
            try:
                header = again.get_into(k, out)
            except BlockError:
                continue
            if header is not None:
                check_payload(out, n, k)
            else:
                assert spans[k][0] + HEADER_SIZE > cut or spans[k][0] + spans[k][1] > cut


def test_capacity_bound_with_mixed_sizes(tmp_path: Path):
    cap = 40 * PAGE
    rng = random.Random(3)
    with SlabTier(NS_A, tmp_path, cap, io="threads") as tier:
        for step in range(300):
            key = make_key(rng.randrange(30))
            n = rng.choice([100, 5_000, 9_000, 20_000, 30_000])
            tier.put(key, make_payload(key, step, n))
            if rng.random() < 0.1:
                tier.delete(key)
            assert tier.usage().used_bytes + tier.ledger.kept <= cap, step
        for key in tier.iter_keys():
            check_payload(_get(tier, key, 30_000), tier._index[key].header.raw_len, key)


def test_reserve_grows_the_file_to_the_size_once_and_writes_then_never_grow_it(tmp_path: Path):
    block = 30_000
    slot = PAGE + align_up(block)
    cap = 24 * slot + 100
    with SlabTier(NS_A, tmp_path, cap, io="threads", codec="raw") as tier:
        assert tier.reserve(block) == 24 * slot
        assert tier.reserve(block) == 0  # already there
        (path,) = list(tier.root.glob("*.slab"))
        assert path.stat().st_size == 24 * slot
        allocated = os.stat(path).st_blocks * 512
        assert allocated >= 24 * slot  # the room is taken, not a sparse file
        keys = [make_key(i) for i in range(40)]  # more than fit: the oldest are evicted
        for i, key in enumerate(keys):
            assert tier.put(key, make_payload(key, i, block))
            assert path.stat().st_size == 24 * slot
        held = list(tier.iter_keys())
        assert len(held) == 24 and tier.usage().used_bytes <= cap
        for key in held:
            check_payload(_get(tier, key, block), block, key)
    with SlabTier(NS_A, tmp_path / "touched", cap, io="threads", codec="raw") as touched:
        assert touched.reserve(block, touch=True) == 24 * slot  # the room written once (zeros)
        (path,) = list(touched.root.glob("*.slab"))
        assert path.stat().st_size == 24 * slot and path.read_bytes() == bytes(24 * slot)
        key = make_key(1)
        assert touched.put(key, make_payload(key, 1, block))
        check_payload(_get(touched, key, block), block, key)
    with SlabTier(NS_A, tmp_path / "coded", cap, io="threads", codec="kv") as coded:
        assert coded.reserve(block) == 0  # coded blocks' sizes vary: nothing to reserve


# --- two processes -----------------------------------------------------------------------------
def test_two_processes_never_see_a_torn_block(tmp_path: Path):
    nkeys = 24
    proc = _start_writer(tmp_path, nkeys, 5, "threads")
    served = foreign = 0
    try:
        wait_lines(proc, 3)
        rng = random.Random(11)
        with SlabTier(NS_A, tmp_path, 2 << 20, depth=4, rescan=0.01) as tier:
            keys = [make_key(i) for i in range(nkeys)]
            deadline = time.monotonic() + 2.0
            step = 0
            while time.monotonic() < deadline:
                step += 1
                if step % 3 == 0:  # this process writes the same keys too
                    batch = rng.sample(keys, 3)
                    tier.put_many(_items(batch, 9_000_000 + step, [30_000] * 3))
                batch = rng.sample(keys, 6)
                outs = [aligned_array(40_000) for _ in batch]
                for k, res, out in zip(batch, tier.get_many_into(batch, outs), outs, strict=True):
                    assert not isinstance(res, BlockError), res
                    if res is not None:
                        check_payload(out, res.raw_len, k)
                        served += 1
                        foreign += check_payload(out, res.raw_len, k) < 9_000_000
                if proc.poll() is not None:
                    raise AssertionError(f"writer died: {proc.stderr.read()}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert served > 0 and foreign > 0


def test_a_read_of_another_writers_new_block_finds_it_however_lately_the_tier_looked(
    tmp_path: Path,
):
    """A lookup in one process promises a block another writer just published; the reader's
    own listing is younger than its rescan interval, and two threads read at once (one of
    them mid-rescan): both still find the block instead of calling it a miss."""
    import threading

    n = 64 * 1024
    with (
        SlabTier(NS_A, tmp_path, 8 * MiB, rescan=60.0) as writer,
        SlabTier(NS_A, tmp_path, 8 * MiB, rescan=60.0) as reader,
    ):
        assert not reader.contains(make_key(0))  # its listing is fresh: no rescan for 60 s
        keys = [make_key(i) for i in range(2)]
        assert all(writer.put(k, make_payload(k, 1, n)) for k in keys)
        outs = [aligned_array(n) for _ in keys]
        got: list = [None, None]

        def read(i: int) -> None:
            got[i] = reader.get_many_into([keys[i]], [outs[i]])[0]

        threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for i, k in enumerate(keys):
            assert got[i] is not None and not isinstance(got[i], Exception)
            assert check_payload(outs[i], n, k) == 1
