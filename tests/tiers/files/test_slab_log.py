"""The slab files' index logs: a reader follows another writer's log instead of rescanning every
slot, falls back to a scan when the log rotates, is damaged or is gone, and never serves wrong
bytes because of a log record."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kvtier.codec import BlockError, BlockMeta
from kvtier.specs import MiB
from kvtier.testing.tier_conformance import NS_A, check_payload, make_key, make_payload
from kvtier.tiers.files import slab_log
from kvtier.tiers.files.slab import SlabTier
from kvtier.tiers.files.slab_log import LOG, RECORD

SIZE = 20_000


def _put(tier: SlabTier, keys, version: int) -> None:
    items = [(k, make_payload(k, version, SIZE), BlockMeta()) for k in keys]
    assert all(tier.put_many(items))


def _scans(tier: SlabTier) -> list[str]:
    """Record the files ``tier`` scans slot by slot from now on (the tier's own method, run)."""
    calls: list[str] = []
    scan = tier._scan

    def counted(f, verify):
        calls.append(f.path)
        return scan(f, verify)

    tier._scan = counted
    return calls


def _served(tier: SlabTier, keys) -> list[int | None]:
    """Each key's payload version as ``tier`` serves it (None: a miss); wrong bytes fail."""
    outs = [np.zeros(SIZE, np.uint8) for _ in keys]
    versions: list[int | None] = []
    for key, res, out in zip(keys, tier.get_many_into(keys, outs), outs, strict=True):
        if res is None or isinstance(res, BlockError):
            versions.append(None)
        else:
            versions.append(check_payload(out, res.raw_len, key))
    return versions


def _pair(tmp_path: Path, capacity: int = 4 * MiB) -> tuple[SlabTier, SlabTier]:
    writer = SlabTier(NS_A, tmp_path, capacity, io="threads", rescan=0.0)
    _put(writer, [make_key(0)], 1)  # the writer's slab file exists before the reader opens
    reader = SlabTier(NS_A, tmp_path, capacity, io="threads", rescan=0.0)
    return writer, reader


def test_a_reader_follows_the_log_without_scanning(tmp_path: Path):
    writer, reader = _pair(tmp_path)
    with writer, reader:
        assert _served(reader, [make_key(0)]) == [1]
        scans = _scans(reader)
        keys = [make_key(i) for i in range(1, 9)]
        _put(writer, keys, 2)
        assert reader.contains_many(keys) == [True] * len(keys)
        assert _served(reader, keys) == [2] * len(keys)
        assert scans == []
        assert os.path.getsize(writer._index[keys[0]].file.path + LOG) == 9 * RECORD


def test_a_rotated_log_falls_back_to_one_scan(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(slab_log, "ROTATE_MIN", 4)
    monkeypatch.setattr(slab_log, "ROTATE_FACTOR", 1)
    writer, reader = _pair(tmp_path, capacity=6 * (SIZE + 3 * 4096))
    with writer, reader:
        scans = _scans(reader)
        for version in range(2, 8):  # slots are reused: old records point at other keys now
            keys = [make_key(100 * version + i) for i in range(3)]
            _put(writer, keys, version)
            assert _served(reader, keys) == [version] * 3
        assert scans, "the log rotated: the reader must have scanned once"
        held = list(writer.iter_keys())
        served = _served(reader, held)
        assert all(v is not None for v in served)
        gone = [make_key(200 + i) for i in range(3)]
        assert not set(gone) & set(held)  # evicted by the writer: misses, never other bytes
        assert _served(reader, gone) == [None] * 3


@pytest.mark.parametrize("damage", ["garbage", "torn", "deleted"])
def test_a_damaged_or_missing_log_costs_a_scan_never_data(tmp_path: Path, damage: str):
    writer, reader = _pair(tmp_path)
    with writer, reader:
        assert _served(reader, [make_key(0)]) == [1]
        log = writer._index[make_key(0)].file.path + LOG
        if damage == "garbage":  # records of another generation / no valid header
            with open(log, "ab") as f:
                f.write(np.random.default_rng(5).bytes(3 * RECORD))
        elif damage == "torn":
            with open(log, "ab") as f:
                f.write(b"\x01" * (RECORD // 2))
        else:
            os.unlink(log)
            reader._foreign[writer._index[make_key(0)].file.path].tail.close()
        keys = [make_key(i) for i in range(1, 6)]
        _put(writer, keys, 3)
        if damage == "deleted":  # the writer keeps appending to its unlinked log: scans it is
            assert not os.path.exists(log)
        assert _served(reader, keys) == [3] * len(keys)


def test_blocks_the_writer_evicted_are_no_longer_listed_by_a_reader(tmp_path: Path):
    writer, reader = _pair(tmp_path, capacity=6 * (SIZE + 3 * 4096))
    with writer, reader:
        first = [make_key(i) for i in range(1, 4)]
        _put(writer, first, 2)
        assert reader.contains_many(first) == [True] * 3
        later = [make_key(i) for i in range(10, 17)]
        for key in later:  # the writer's whole capacity: the first keys are evicted
            _put(writer, [key], 3)
        assert not any(writer.contains_many(first))
        assert reader.contains_many(first) == [False] * 3  # nothing promised the writer lost
        assert reader.contains_many(later) == writer.contains_many(later)


def test_a_reader_opened_later_does_not_list_a_block_that_left_its_slot(tmp_path: Path):
    """An overwrite frees the old slot with its valid bytes still there; after a delete no
    slot holds the key for its writer, and a scan alone would list the old copy again."""
    writer, _ = _pair(tmp_path)
    with writer:
        key = make_key(7)
        _put(writer, [key], 1)
        _put(writer, [key], 2)  # a fresh slot; the old one keeps version 1's bytes
        assert writer.delete(key)
        reader = SlabTier(NS_A, tmp_path, 4 * MiB, io="threads", rescan=0.0)
        with reader:
            scans = _scans(reader)
            assert not reader.contains(key) and _served(reader, [key]) == [None]
            assert reader.contains(make_key(0)) and scans == []


def test_a_log_emptied_and_refilled_to_the_same_length_is_noticed(tmp_path: Path):
    writer, reader = _pair(tmp_path)
    with writer, reader:
        _put(writer, [make_key(i) for i in range(1, 21)], 1)
        assert reader.contains(make_key(20))
        f = writer._index[make_key(0)].file
        offset = reader._foreign[f.path].tail.offset
        f.log._restart()  # a new generation, as the writer starts when the log grows too long
        fresh = []
        while os.path.getsize(f.path + LOG) < offset:
            fresh.append(make_key(100 + len(fresh)))
            _put(writer, fresh[-1:], 2)
        assert os.path.getsize(f.path + LOG) == offset  # where the reader stood
        assert reader.contains_many(fresh) == [True] * len(fresh)


def test_a_file_that_appears_after_the_reader_opened_is_scanned_once(tmp_path: Path):
    reader = SlabTier(NS_A, tmp_path, 4 * MiB, io="threads", rescan=0.0)
    writer = SlabTier(NS_A, tmp_path, 4 * MiB, io="threads", rescan=0.0)
    with reader, writer:
        keys = [make_key(i) for i in range(6)]
        _put(writer, keys[:5], 1)
        writer._index[keys[0]].file.log._restart()  # the first five are no longer in the log
        _put(writer, keys[5:], 1)
        scans = _scans(reader)
        assert reader.contains_many(keys) == [True] * 6
        assert len(scans) == 1
        assert _served(reader, keys) == [1] * 6
