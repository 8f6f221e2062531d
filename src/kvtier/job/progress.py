"""How a job says how far it has got: ``progress(label, done, total)``, called at each step.

Both jobs take such a callback (the command line's progress bar, or :func:`quiet`); each says
what its steps are.
"""

from __future__ import annotations

from collections.abc import Callable

#: progress(label, done, total): the step a job is at, of how many.
Progress = Callable[[str, int, int], None]


def quiet(label: str, done: int, total: int) -> None:
    """A :data:`Progress` that shows nothing (a job run without a progress bar)."""
    return None


__all__ = ["Progress", "quiet"]
