"""Reliability of the disk tier with real files and real processes.

A writer killed with SIGKILL mid-burst leaves only whole blocks behind; damaged, truncated,
swapped or foreign block files are always detected; readers in one process never see a torn
block while writers in other processes rewrite the same keys.
"""

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

from kvtier.codec import HEADER_SIZE, BlockError, ForeignBlockError
from kvtier.testing.tier_conformance import (
    NS_A,
    check_payload,
    kill_mid_burst,
    make_key,
    make_payload,
    read_all_blocks,
    wait_lines,
)
from kvtier.tiers.files.per_block import DiskTier
from kvtier.tiers.io.buffers import PAGE

# A writer process: bursts of put_many (keys reused, sizes vary by key), some deletes; it prints
# the step it finished so the test knows the burst is under way.
WRITER = r"""
import sys
from kvtier.codec import BlockMeta
from kvtier.testing.tier_conformance import NS_A, make_key, make_payload
from kvtier.tiers.files.per_block import DiskTier

root, base, keys, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tier = DiskTier(NS_A, root, 256 << 20, io="threads", depth=4)
step = 0
while True:
    batch = []
    for j in range(4):
        i = (step * 4 + j + seed) % keys
        k = make_key(i)
        batch.append((k, make_payload(k, seed * 1_000_000 + step, base + i * 97), BlockMeta()))
    tier.put_many(batch)
    if step % 7 == 3:
        tier.delete(make_key((step + seed) % keys))
    print(step, flush=True)
    step += 1
"""


def _start_writer(root: Path, base: int, keys: int, seed: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(base), str(keys), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_kill_9_during_a_burst_leaves_only_whole_blocks(tmp_path: Path):
    rng = random.Random(99)
    base, keys = 48 * 1024, 40
    recovered = 0
    for round_ in range(3):
        proc = _start_writer(tmp_path, base, keys, seed=round_)
        kill_mid_burst(proc, rng.randrange(2, 25), rng.random() * 0.02)
        with DiskTier(NS_A, tmp_path, 256 << 20) as tier:
            recovered = read_all_blocks(tier, base + keys * 97)
            assert recovered == tier.usage().blocks
            leftovers = [p for p in Path(tier.root).rglob("*.tmp")]
            assert not leftovers, f"temp files of the dead writer survived: {leftovers}"
    assert recovered > 0


def test_random_bit_flips_are_always_detected(tmp_path: Path):
    n = 20_000 + 7
    rng = random.Random(5)
    with DiskTier(NS_A, tmp_path, 1 << 20) as tier:
        key = make_key(1)
        payload = make_payload(key, 1, n)
        tier.put(key, payload)
        path = tier.block_path(key)
        pristine = Path(path).read_bytes()
        meaningful = [(0, HEADER_SIZE), (PAGE, PAGE + n)]
        detected = 0
        for _ in range(150):
            offset = rng.randrange(len(pristine))
            damaged = bytearray(pristine)
            damaged[offset] ^= 1 << rng.randrange(8)
            Path(path).write_bytes(damaged)
            out = np.zeros(n, np.uint8)
            try:
                tier.get_into(key, out)
            except BlockError:
                detected += 1
                continue
            assert not any(a <= offset < b for a, b in meaningful), f"flip at {offset} served"
            assert np.array_equal(out, payload), "a flip in the padding changed the data"
        assert detected > 100


def test_truncation_at_any_length_is_detected(tmp_path: Path):
    n = 3 * PAGE + 500
    rng = random.Random(6)
    with DiskTier(NS_A, tmp_path, 1 << 20) as tier:
        key = make_key(1)
        tier.put(key, make_payload(key, 1, n))
        path = tier.block_path(key)
        pristine = Path(path).read_bytes()
        for length in [*rng.sample(range(len(pristine)), 40), PAGE, 2 * PAGE, 0]:
            Path(path).write_bytes(pristine[:length])
            with pytest.raises(BlockError):
                tier.get_into(key, np.zeros(n, np.uint8))


def test_shuffled_block_files_are_always_detected(tmp_path: Path):
    rng = random.Random(8)
    with DiskTier(NS_A, tmp_path, 1 << 20) as tier:
        keys = [make_key(i) for i in range(6)]
        for k in keys:
            tier.put(k, make_payload(k, 0, 5000))
        contents = {k: Path(tier.block_path(k)).read_bytes() for k in keys}
        for _ in range(5):
            order = keys[:]
            rng.shuffle(order)
            for k, src in zip(keys, order, strict=True):
                Path(tier.block_path(k)).write_bytes(contents[src])
            for k, src in zip(keys, order, strict=True):
                out = np.zeros(5000, np.uint8)
                if k == src:
                    assert tier.get_into(k, out) is not None
                    check_payload(out, 5000, k)
                else:
                    with pytest.raises(ForeignBlockError):
                        tier.get_into(k, out)


def test_readers_never_see_torn_blocks_while_other_processes_write(tmp_path: Path):
    base, keys = 40 * 1024, 8
    writers = [_start_writer(tmp_path, base, keys, seed=s) for s in (1, 2)]
    try:
        for w in writers:
            wait_lines(w, 1)
        good = 0
        with DiskTier(NS_A, tmp_path, 256 << 20, depth=4) as tier:
            outs = [np.zeros(base + keys * 97, np.uint8) for _ in range(keys)]
            all_keys = [make_key(i) for i in range(keys)]
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                for key, res, out in zip(
                    all_keys, tier.get_many_into(all_keys, outs), outs, strict=True
                ):
                    assert not isinstance(res, BlockError), f"reader saw a bad block: {res}"
                    if res is not None:
                        check_payload(out, res.raw_len, key)
                        good += 1
                k = random.choice(all_keys)
                header = tier.get_into(k, outs[0])
                if header is not None:
                    check_payload(outs[0], header.raw_len, k)
                    good += 1
        assert good > 20
        for w in writers:
            assert w.poll() is None, f"writer failed: {w.stderr.read()}"
    finally:
        for w in writers:
            w.send_signal(signal.SIGKILL)
            w.wait()
    with DiskTier(NS_A, tmp_path, 256 << 20) as tier:
        read_all_blocks(tier, base + keys * 97)


def test_writer_subprocess_uses_this_checkout():
    """The writer script imports kvtier from the same place as the tests do."""
    out = subprocess.run(
        [sys.executable, "-c", "import kvtier.tiers.files.per_block as d; print(d.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    import kvtier.tiers.files.per_block as d

    assert os.path.samefile(out.stdout.strip(), d.__file__)
