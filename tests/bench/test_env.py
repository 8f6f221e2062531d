"""Facts about the benchmark's host: the load average a report keeps."""

from __future__ import annotations

import os

from kvtier.bench import env
from kvtier.bench.env import load_average


def test_the_load_average_is_three_figures_to_the_hundredth():
    loads = load_average()
    assert len(loads) == 3
    assert all(x >= 0 and round(x, 2) == x for x in loads)


def test_the_load_average_is_empty_where_the_host_cannot_tell(monkeypatch):
    def unknown() -> tuple[float, float, float]:
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", unknown)
    assert env.load_average() == []
