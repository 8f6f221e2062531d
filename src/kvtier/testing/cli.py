"""Running a typer app in-process as its console script does, for tests of the command line."""

from __future__ import annotations

import sys


def run_cli(app, monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run ``app`` with ``args`` as its command line; (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["kvtier", *args])
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


__all__ = ["run_cli"]
