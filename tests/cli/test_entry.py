"""The ``kvtier`` command without the tools extra: one line saying what to install, exit 2."""

from __future__ import annotations

import subprocess
import sys

_WITHOUT_TYPER = """
import sys
sys.modules["typer"] = None  # as if the tools extra were not installed: importing it fails
sys.argv = ["kvtier", "plan"]
from kvtier.cli.entry import main
main()
"""


def test_without_the_tools_extra_the_command_says_what_to_install():
    out = subprocess.run([sys.executable, "-c", _WITHOUT_TYPER], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: kvtier's commands need typer (pip install 'kvtier[tools]')"
    ]


def test_with_it_the_command_runs():
    out = subprocess.run(
        [sys.executable, "-c", "from kvtier.cli.entry import main; main()", "--help"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "plan" in out.stdout
