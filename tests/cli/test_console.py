"""A report printed as JSON alone, or drawn on a wide-enough console."""

from __future__ import annotations

from rich.console import Console

from kvtier.cli.console import print_report, table_console


def test_json_goes_alone_to_stdout(capsys):
    drawn: list[Console] = []
    print_report(True, lambda: '{"a": 1}', drawn.append)
    assert capsys.readouterr().out == '{"a": 1}\n'
    assert drawn == []


def test_the_table_is_drawn_on_a_console_at_least_as_wide_as_asked(capsys):
    drawn: list[Console] = []

    def never() -> str:
        raise AssertionError("no JSON without --json")

    print_report(False, never, drawn.append, width=190)
    (console,) = drawn
    assert console.is_terminal or console.width >= 190


def test_table_console_is_wide_when_piped():
    out = table_console(170)
    assert out.is_terminal or out.width >= 170
