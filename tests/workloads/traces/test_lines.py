"""A format's units: each value a caller gives replaces the format's own, the rest stay."""

from __future__ import annotations

from kvtier.workloads.traces.lines import TraceUnits


def test_given_values_replace_the_formats_own_and_none_keeps_them():
    own = TraceUnits(block_tokens=512, time_unit_s=1e-3, namespace=b"mooncake")
    assert own.given() == own
    assert own.given(block_tokens=16) == TraceUnits(16, 1e-3, b"mooncake")
    assert own.given(time_unit_s=1.0, namespace=b"x") == TraceUnits(512, 1.0, b"x")
    assert own.given(0, 0.0, b"") == TraceUnits(0, 0.0, b"")  # falsy values still count
