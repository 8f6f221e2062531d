"""What every long command draws: a progress bar on stderr and a wide enough table on stdout."""

from __future__ import annotations

from collections.abc import Callable

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def step_progress(console: Console, **options) -> Progress:
    """A transient progress bar (label, bar, done/total, time elapsed) drawn on ``console``."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        **options,
    )


def table_console(width: int = 160) -> Console:
    """The stdout console, at least ``width`` columns wide when stdout is not a terminal (a
    table piped to a file keeps its rows on one line each)."""
    out = Console()
    if not out.is_terminal:
        out.width = max(out.width, width)
    return out


def print_report(
    json_out: bool,
    as_json: Callable[[], str],
    draw: Callable[[Console], object],
    width: int = 160,
) -> None:
    """Print a command's report: ``as_json()`` alone on stdout with ``--json``, else what
    ``draw`` puts on a :func:`table_console` at least ``width`` columns wide."""
    if json_out:
        typer.echo(as_json())
    else:
        draw(table_console(width))


__all__ = ["print_report", "step_progress", "table_console"]
