"""The kv codec's C part: split/merge equal numpy's, the order-1 Huffman section round-trips any
plane (and decodes the same in the Python reference decoder), and a damaged section is a
ValueError or stays within its output — never a crash or a write past it."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.codec import planes
from kvtier.codec.errors import CorruptBlockError

K = planes._kvcore


def test_the_c_part_is_built():
    """make setup builds codec/_kvcore.c (gcc is on every machine this runs on)."""
    assert planes.native(), "the kv codec's C part did not build; pip install -e ."


def _numpy_split(raw: np.ndarray, tokens: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    n = raw.size // 2
    pairs = raw[: 2 * n].reshape(n, 2)
    group = tokens * channels
    m = n // group * group
    high = pairs[:, 1].copy()
    high[:m] = pairs[:m, 1].reshape(-1, tokens, channels).transpose(0, 2, 1).ravel()
    return high, pairs[:, 0].copy()


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.sampled_from([1, 3, 16, 32, 48]),
    channels=st.sampled_from([1, 5, 16, 64]),
    groups=st.integers(0, 3),
    extra=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
    threads=st.sampled_from([1, 2]),
)
def test_split_and_merge_match_numpy_for_any_layout(tokens, channels, groups, extra, seed, threads):
    """Tiled (multiples of 16) and plain layouts, whole groups and a token-order remainder, on
    one thread or two (half the groups each)."""
    n = groups * tokens * channels + extra
    raw = np.random.default_rng(seed).integers(0, 256, 2 * n, dtype=np.uint8)
    high, low = np.empty(n, np.uint8), np.empty(n, np.uint8)
    K.split(raw, high, low, tokens, channels, threads)
    want_high, want_low = _numpy_split(raw, tokens, channels)
    assert np.array_equal(high, want_high) and np.array_equal(low, want_low)
    out = np.full(2 * n + 3, 0xA5, np.uint8)
    K.merge(high, low, out, tokens, channels, threads)
    assert np.array_equal(out[: 2 * n], raw) and (out[2 * n :] == 0xA5).all()


@pytest.mark.parametrize("offset", [0, 16, 1])
def test_merge_of_a_large_block_streams_its_stores_and_stays_exact(offset):
    """Outputs of a MiB or more are written with streaming stores where aligned (offset 0: 32
    bytes, for AVX2's; 16: SSE2's) and with plain ones where not (offset 1): the same bytes,
    nothing written past the end."""
    tokens, channels, groups = 256, 64, 40
    n = tokens * channels * groups + 7
    raw = np.random.default_rng(5).integers(0, 256, 2 * n, dtype=np.uint8)
    high, low = np.empty(n, np.uint8), np.empty(n, np.uint8)
    K.split(raw, high, low, tokens, channels)
    buf = np.full(2 * n + 64, 0xA5, np.uint8)
    start = (-buf.ctypes.data) % 32 + offset
    out = buf[start : start + 2 * n]
    K.merge(high, low, out, tokens, channels)
    assert np.array_equal(out, raw)
    assert (buf[:start] == 0xA5).all() and (buf[start + 2 * n :] == 0xA5).all()


@pytest.mark.parametrize("channels", [1040, 2080])
def test_merge_of_more_channels_than_one_transpose_takes_stays_exact(channels):
    """Wider groups than MERGE_ROW channels are merged a column band at a time (SSE2 for 1040
    channels, AVX2 where built for 2080), the last band partial."""
    tokens = 32
    n = tokens * channels * 2
    raw = np.random.default_rng(channels).integers(0, 256, 2 * n, dtype=np.uint8)
    high, low = np.empty(n, np.uint8), np.empty(n, np.uint8)
    K.split(raw, high, low, tokens, channels)
    assert np.array_equal(high, _numpy_split(raw, tokens, channels)[0])
    out = np.zeros(2 * n, np.uint8)
    K.merge(high, low, out, tokens, channels)
    assert np.array_equal(out, raw)


def test_split_and_merge_refuse_sizes_that_do_not_match():
    raw = np.zeros(64, np.uint8)
    with pytest.raises(ValueError):
        K.split(raw, np.empty(40, np.uint8), np.empty(40, np.uint8), 4, 4)
    with pytest.raises(ValueError):
        K.merge(np.empty(8, np.uint8), np.empty(9, np.uint8), raw, 4, 4)
    with pytest.raises(ValueError):
        K.merge(np.empty(8, np.uint8), np.empty(8, np.uint8), raw, 0, 4)


def _plane(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "one":  # a single symbol: one-bit codes
        return np.full(n, int(rng.integers(0, 256)), np.uint8)
    if kind == "uniform":  # every byte value, no structure
        return rng.integers(0, 256, n, dtype=np.uint8)
    if kind == "skewed":  # a few symbols, very unequal: long codes get length-limited
        p = 0.5 ** np.arange(1, 21)
        return rng.choice(np.arange(100, 120, dtype=np.uint8), n, p=p / p.sum())
    walk = np.cumsum(rng.integers(-1, 2, n)) % 7  # "walk": the previous symbol predicts
    return (120 + walk).astype(np.uint8)


#: A plane of each kind (see ``_plane``), coded with every context shift and both code-length
#: limits; the tests add the plane's length.
PLANE_CASES = dict(
    kind=st.sampled_from(["one", "uniform", "skewed", "walk"]),
    shift=st.integers(0, 7),
    maxbits=st.sampled_from([K.NARROW, K.MAXBITS]),
    seed=st.integers(0, 2**32 - 1),
)


@settings(max_examples=40, deadline=None)
@given(n=st.one_of(st.integers(1, 70), st.integers(1000, 60_000)), **PLANE_CASES)
def test_o1_sections_round_trip_in_c_and_python(kind, n, shift, maxbits, seed):
    """Both code-length limits (each has its own decoder tables in C)."""
    plane = _plane(kind, n, np.random.default_rng(seed))
    section = K.o1_encode(plane, shift, maxbits)
    assert K.o1_encode(plane, shift, maxbits, 2) == section  # two threads: the same section
    if section is None:  # only where it would not beat the plane stored as is
        return
    assert len(section) < n and section[1] == maxbits
    for threads in (1, 2):  # two: half the streams on a thread of their own
        out = np.full(n + 8, 0x5A, np.uint8)
        K.o1_decode(section, out[:n], threads)
        assert np.array_equal(out[:n], plane) and (out[n:] == 0x5A).all()
    if n <= 5000:
        assert np.array_equal(planes.o1_decode_py(section, n), plane)


@settings(max_examples=30, deadline=None)
@given(n=st.one_of(st.integers(1, 70), st.integers(1000, 200_000)), **PLANE_CASES)
def test_o1_encode_into_writes_the_same_section_or_says_it_has_no_room(
    kind, n, shift, maxbits, seed
):
    plane = _plane(kind, n, np.random.default_rng(seed))
    section = K.o1_encode(plane, shift, maxbits)
    out = np.full(n + 64, 0xA5, np.uint8)
    got = K.o1_encode_into(plane, shift, maxbits, out[:n])
    if section is None:
        assert got == 0
        return
    assert got == len(section) and out[:got].tobytes() == section
    assert (out[n:] == 0xA5).all()  # never past the room it was given
    two = np.full(n + 64, 0xA5, np.uint8)
    assert K.o1_encode_into(plane, shift, maxbits, two[:n], 2) == got
    assert np.array_equal(two, out)
    assert K.o1_encode_into(plane, shift, maxbits, out[: got - 1]) == 0
    assert K.o1_encode_into(plane, shift, maxbits, bytearray(got)) == got
    with pytest.raises(TypeError):  # a read-only buffer is refused
        K.o1_encode_into(plane, shift, maxbits, bytes(got))


def test_o1_code_lengths_are_limited_to_the_two_the_decoder_knows():
    plane = _plane("skewed", 50_000, np.random.default_rng(2))
    for maxbits in (K.NARROW, K.MAXBITS):
        section = K.o1_encode(plane, 0, maxbits)
        # the reference decoder reads what C writes
        assert np.array_equal(planes.o1_decode_py(section, 50_000), plane)
        other = bytearray(section)
        other[1] = 10  # a width neither decoder has tables for
        with pytest.raises(ValueError):
            K.o1_decode(bytes(other), np.empty(50_000, np.uint8))
        with pytest.raises(CorruptBlockError):
            planes.o1_decode_py(bytes(other), 50_000)
    for maxbits in (8, 10, 12):
        with pytest.raises(ValueError):
            K.o1_encode(plane, 0, maxbits)


def test_an_o1_section_asked_for_another_length_is_refused():
    plane = _plane("walk", 50_000, np.random.default_rng(1))
    section = K.o1_encode(plane, 0)
    for n in (49_999, 50_001, 10):
        with pytest.raises(ValueError):
            K.o1_decode(section, np.empty(n, np.uint8))
        with pytest.raises(CorruptBlockError):
            planes.o1_decode_py(section, n)


def test_damaged_o1_sections_fail_or_stay_within_their_output():
    """Time-bounded: a damaged section is a ValueError or decodes, within bounds, to something
    (the block checksum catches that); truncation is always refused."""
    rng = np.random.default_rng(3)
    goods = [
        (K.o1_encode(_plane(kind, 40_000, rng), 0, maxbits), 40_000)
        for kind in ("walk", "skewed", "uniform")
        for maxbits in (K.NARROW, K.MAXBITS)
    ]
    goods = [(s, n) for s, n in goods if s is not None]
    for section, n in goods:
        for keep in (0, 3, 36, 40, len(section) // 2, len(section) - 1):
            for threads in (1, 2):
                with pytest.raises(ValueError):
                    K.o1_decode(section[:keep], np.empty(n, np.uint8), threads)
    deadline, tries = time.monotonic() + 2.0, 0
    while time.monotonic() < deadline:
        section, n = goods[tries % len(goods)]
        bad = bytearray(section)
        for _ in range(int(rng.integers(1, 4))):
            near = 400 if rng.random() < 0.5 else len(bad)
            bad[int(rng.integers(0, min(near, len(bad))))] = int(rng.integers(0, 256))
        out = np.full(n + 64, 0x5A, np.uint8)
        with contextlib.suppress(ValueError):
            K.o1_decode(bytes(bad), out[:n], 1 + tries % 2)
        assert (out[n:] == 0x5A).all()
        tries += 1
    assert tries > 50


@pytest.mark.parametrize(
    ("tokens", "channels", "groups", "extra"),
    [(256, 64, 180, 0), (16, 16, 1, 0), (16, 32, 3, 5), (7, 3, 40, 1)],
)
def test_decode_planes_on_two_threads_writes_what_one_thread_writes(
    tokens, channels, groups, extra
):
    """The streams split between two threads, then the merge's groups (one group: no split)."""
    rng = np.random.default_rng(tokens + groups)
    n = tokens * channels * groups + extra
    raw = np.empty(2 * n, np.uint8)
    raw[0::2] = rng.integers(0, 256, n, dtype=np.uint8)
    raw[1::2] = _plane("walk", n, rng)
    high, low = np.empty(n, np.uint8), np.empty(n, np.uint8)
    K.split(raw, high, low, tokens, channels)
    section = K.o1_encode(high, 0)
    assert section is not None
    for threads in (1, 2):
        out = np.full(2 * n + 32, 0x5A, np.uint8)
        K.decode_planes(section, True, low, out[: 2 * n], tokens, channels, threads)
        assert np.array_equal(out[: 2 * n], raw) and (out[2 * n :] == 0x5A).all()
        bad = bytearray(section)
        bad[len(bad) // 2 :] = bytes(len(bad) - len(bad) // 2)  # the later streams zeroed
        with pytest.raises(ValueError):
            K.decode_planes(bytes(bad), True, low, out[: 2 * n], tokens, channels, threads)


def test_decode_planes_checks_its_sizes():
    low, out = np.zeros(100, np.uint8), np.zeros(200, np.uint8)
    with pytest.raises(ValueError):  # a raw high plane of another size
        K.decode_planes(b"\x00" * 99, False, low, out, 10, 10)
    with pytest.raises(ValueError):  # an output too small for the planes
        K.decode_planes(b"\x00" * 100, False, low, out[:199], 10, 10)
    with pytest.raises(ValueError):  # not a section
        K.decode_planes(b"\x00" * 50, True, low, out, 10, 10)


@pytest.mark.parametrize("count", [1, 3, 4, 1001, 8192])
def test_high_entropy_is_the_collision_entropy_of_the_high_bytes(count):
    raw = np.random.default_rng(count).integers(0, 7, 2 * count + 10, dtype=np.uint8)
    high = raw[1 : 2 * count : 2]
    p = np.bincount(high, minlength=256)
    p = p[p > 0] / high.size
    collision = float(-np.log2((p * p).sum()))
    assert K.high_entropy(raw, count) == pytest.approx(collision, abs=1e-9)
    assert K.high_entropy(raw, count) <= float(-(p * np.log2(p)).sum()) + 1e-9  # <= Shannon


def test_high_entropy_refuses_a_count_beyond_the_buffer():
    for count in (0, 6):
        with pytest.raises(ValueError):
            K.high_entropy(np.zeros(11, np.uint8), count)
