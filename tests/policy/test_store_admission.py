"""Sightings: which chunks of a prompt repeat earlier prompts', and whether prompts repeat."""

from __future__ import annotations

import pytest

from kvtier.policy.store_admission import Sightings, StoreAdmission


def _keys(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def test_a_chunk_repeats_when_an_earlier_prompt_held_it():
    book = Sightings(window=4)
    assert book.sight(_keys("a", 3)) == [False, False, False]
    assert book.sight(_keys("a", 2) + _keys("b", 2)) == [True, True, False, False]
    assert book.sight(_keys("b", 2)) == [True, True]


def test_repeating_until_a_window_of_prompts_repeats_nothing_then_a_repeat_reopens_it():
    book = Sightings(window=3)
    for i in range(3):
        assert book.repeating  # nothing known against storing yet
        book.sight(_keys(f"p{i}", 2))
    assert not book.repeating
    book.sight([])  # a prompt without a whole chunk changes nothing
    assert not book.repeating
    book.sight(_keys("p0", 1) + _keys("q", 1))
    assert book.repeating
    for i in range(3):  # the repeat leaves the window after three more one-shot prompts
        assert book.repeating
        book.sight(_keys(f"r{i}", 2))
    assert not book.repeating


def test_memory_forgets_the_oldest_keys_and_keeps_those_seen_again():
    book = Sightings(window=8, memory=4)
    book.sight(_keys("a", 4))
    book.sight(_keys("a", 1))  # a-0 seen again: now the most recent
    book.sight(_keys("b", 2))  # evicts a-1, a-2
    assert [book.sight([k])[0] for k in (b"a-0", b"a-3", b"b-1", b"a-1")] == [
        True,
        True,
        True,
        False,
    ]


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        Sightings(window=0)
    with pytest.raises(ValueError):
        Sightings(memory=0)


def test_store_admission_by_mode():
    chunks = range(0, 4)
    for mode in ("always", "repeat", "auto"):
        book = StoreAdmission(mode, Sightings(window=1))
        assert book.books == (mode != "always")
        repeats = book.sight(_keys("a", 4))
        assert repeats == ([] if mode == "always" else [False] * 4)
        # one prompt sighted, none repeated: the window of one is full and holds no repeat
        assert list(book.admitted(chunks, repeats)) == ([0, 1, 2, 3] if mode == "always" else [])
        again = book.sight(_keys("a", 2) + _keys("b", 2))
        expect = {"always": [0, 1, 2, 3], "repeat": [0, 1], "auto": [0, 1, 2, 3]}[mode]
        assert list(book.admitted(chunks, again)) == expect
        assert list(book.admitted(chunks, None)) == ([] if mode == "repeat" else expect)
    with pytest.raises(ValueError, match="admit"):
        StoreAdmission("often")
