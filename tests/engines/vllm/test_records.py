"""The records writer: lines in order, off the caller's thread, all of them written on close."""

from __future__ import annotations

import json
import threading

from kvtier.engines.vllm.records import RecordWriter, read_records


def test_every_line_is_written_in_order_by_close(tmp_path):
    path = tmp_path / "records.jsonl"
    writer = RecordWriter(str(path))
    for i in range(2000):
        writer.write({"i": i, "req_id": f"r{i}"})
    writer.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["i"] for x in lines] == list(range(2000))
    writer.write({"i": -1})  # after close: dropped, never raised
    writer.close()
    assert len(path.read_text().splitlines()) == 2000


def test_lines_are_written_by_a_thread_of_its_own(tmp_path):
    path = tmp_path / "records.jsonl"
    writer = RecordWriter(str(path))
    writers = []

    class Line(dict):
        def items(self):  # json.dumps asks for the items on the thread that serialises
            writers.append(threading.current_thread().name)
            return super().items()

    writer.write(Line(a=1))
    writer.close()
    assert writers == ["kvtier-records"]
    assert json.loads(path.read_text()) == {"a": 1}


def test_a_file_that_cannot_be_written_loses_records_not_the_engine():
    writer = RecordWriter("/dev/full")
    writer.write({"a": 1})
    writer.close()  # the write failed (ENOSPC) with a warning


def test_read_records_skips_what_is_not_a_json_object_and_a_missing_file_is_none(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"a": 1}\nnot json\n[1, 2]\n{"b": 2}\n{"c": ')  # the last being written
    assert read_records(path) == [{"a": 1}, {"b": 2}]
    assert read_records(tmp_path / "none.jsonl") == []
