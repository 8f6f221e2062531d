"""The report pieces both jobs share: JSON documents, summary statistics, seconds in tables."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from kvtier.job.report import (
    attribute_dict,
    format_seconds,
    jsonable,
    median,
    percentile,
    report_json,
)


@dataclass
class Record:
    a: int
    b: str

    @property
    def twice(self) -> int:
        return 2 * self.a


def test_attribute_dict_keeps_the_order_asked_and_reads_properties():
    got = attribute_dict(Record(3, "x"), ("twice", "b", "a"))
    assert got == {"twice": 6, "b": "x", "a": 3}
    assert list(got) == ["twice", "b", "a"]
    with pytest.raises(AttributeError):
        attribute_dict(Record(1, "y"), ("missing",))


def test_the_json_writes_tuples_and_sets_as_lists_and_the_rest_as_text():
    assert jsonable((1, 2)) == [1, 2] and jsonable({3}) == [3]
    assert jsonable(Record(1, "y")) == "Record(a=1, b='y')"
    text = report_json({"t": (1, 2), "r": Record(1, "y"), "n": None})
    assert text.startswith('{\n  "t": [\n    1,')
    assert json.loads(text) == {"t": [1, 2], "r": "Record(a=1, b='y')", "n": None}


def test_statistics_are_none_without_values():
    assert median([]) is None and percentile([], 95) is None
    assert median([3.0, 1.0, 2.0, 10.0]) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


def test_seconds_print_as_milliseconds_below_one_second():
    assert format_seconds(None) == "–"
    assert format_seconds(0.01234) == "12.3 ms"
    assert format_seconds(0.01234, ms_digits=0) == "12 ms"
    assert format_seconds(-0.5) == "-500.0 ms"
    assert format_seconds(1.0) == "1.00 s" and format_seconds(-2.345) == "-2.35 s"
