"""The plotting path both jobs share: files named after their plots, paired bars, saved PNGs."""

from __future__ import annotations

from pathlib import Path

from kvtier.job.plot import Bars, paired_bars, plot_writer, pyplot, save, subplots


def plot_first(report: list[float], path: Path) -> Path:
    fig, ax = subplots(figsize=(3, 2))
    ax.plot(report)
    return save(fig, path)


def plot_second(report: list[float], path: Path) -> Path:
    path.write_bytes(b"second")
    return path


def test_the_writer_names_each_file_after_its_plot_and_keeps_their_order(tmp_path):
    write = plot_writer("run-x-", plot_second, plot_first)
    paths = write([1.0, 2.0, 3.0], tmp_path / "new" / "plots")
    assert [p.name for p in paths] == ["run-x-second.png", "run-x-first.png"]
    assert paths[0].read_bytes() == b"second"
    assert paths[1].read_bytes()[:4] == b"\x89PNG"


def test_save_writes_a_png_and_frees_the_figure(tmp_path):
    fig, _ = subplots()
    before = len(pyplot().get_fignums())
    assert save(fig, tmp_path / "f.png") == tmp_path / "f.png"
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert len(pyplot().get_fignums()) == before - 1


def test_paired_bars_stand_either_side_of_each_tick():
    fig, ax = subplots()
    paired_bars(ax, Bars("a", [1.0, 2.0], "#ff0000"), Bars("b", [3.0, 4.0]), width=0.4)
    bars = ax.patches
    assert [round(b.get_x() + b.get_width() / 2, 6) for b in bars] == [-0.2, 0.8, 0.2, 1.2]
    assert [b.get_height() for b in bars] == [1.0, 2.0, 3.0, 4.0]
    assert list(ax.get_xticks()) == [0, 1]
    assert [c.get_label() for c in ax.containers] == ["a", "b"]
    assert bars[0].get_facecolor()[:3] == (1.0, 0.0, 0.0)
    pyplot().close(fig)
