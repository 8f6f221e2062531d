"""The ``kvtier`` command's entry point: the CLI if its extra is installed, else one line.

The command and the instruments behind it (typer, rich, matplotlib, pyyaml) come with the
``tools`` extra; the connector and the cache serve without it.
"""

from __future__ import annotations

import sys

TOOLS = ("typer", "rich", "matplotlib", "yaml")


def main() -> None:
    """Run ``kvtier``; without the tools extra, say how to get it (exit code 2)."""
    try:
        from kvtier.cli.main import app
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] in TOOLS:
            print(
                f"error: kvtier's commands need {exc.name} (pip install 'kvtier[tools]')",
                file=sys.stderr,
            )
            sys.exit(2)
        raise
    app()


__all__ = ["main"]
