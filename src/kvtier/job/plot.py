"""What the plots of both jobs share: matplotlib off-screen, figures saved the same way, a run's
plots written into one folder, each file named after its plot, and two bar series side by side.

The engine-specific modules (:mod:`kvtier.job.hf_plot`, :mod:`kvtier.job.vllm_plot`) draw what
their reports hold; everything about making, laying out and saving a figure lives here, so both
write PNGs of the same resolution the same way. matplotlib is imported when a figure is made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

#: Resolution of every PNG a job writes.
DPI = 110

Report = TypeVar("Report")
#: One plot of a report: (report, path) → the path written.
Plot = Callable[[Report, Path], Path]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the off-screen Agg backend (a job runs without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """A new figure and its axes (``pyplot.subplots``'s arguments), drawn off-screen."""
    return pyplot().subplots(*args, **kwargs)


def save(fig: Any, path: Path) -> Path:
    """Lay ``fig`` out tightly, write it to ``path`` as a PNG, free it; the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def plot_writer(prefix: str, *plots: Plot[Report]) -> Callable[[Report, Path], list[Path]]:
    """A job's ``write_plots(report, directory)``: each ``plot_<name>`` of ``plots`` draws
    ``<prefix><name>.png`` into ``directory`` (created); it returns the paths written, in the
    order of ``plots``."""
    files = [(plot, f"{prefix}{plot.__name__.removeprefix('plot_')}.png") for plot in plots]

    def write_plots(report: Report, directory: Path) -> list[Path]:
        """Write every plot of ``report`` into ``directory`` (created); the paths written."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return [plot(report, directory / name) for plot, name in files]

    return write_plots


@dataclass(frozen=True)
class Bars:
    """One series of a paired bar chart: its legend label, a value per position and its colour
    (None: the axes' next colour)."""

    label: str
    values: list[float]
    color: str | None = None


def paired_bars(ax: Any, left: Bars, right: Bars, width: float = 0.4) -> None:
    """Draw ``left`` and ``right`` side by side at each position of ``ax``, one tick per
    position (label the ticks after)."""
    x = range(len(left.values))
    for bars, shift in ((left, -width / 2), (right, width / 2)):
        ax.bar([i + shift for i in x], bars.values, width, label=bars.label, color=bars.color)
    ax.set_xticks(list(x))


__all__ = ["DPI", "Bars", "Plot", "paired_bars", "plot_writer", "pyplot", "save", "subplots"]
