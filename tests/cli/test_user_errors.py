"""Every path the user gets wrong: one line on stderr, exit 2, no traceback, nothing done first.

Each case runs the real ``kvtier`` command in a subprocess (its console script), in a fresh
working directory that must stay empty: the bad path is refused before a tier is opened, a
benchmark file is made or the model is loaded. The refusals as a user without write permission
run the CLI in a forked child that dropped to ``nobody``, since that user may not exec the
interpreter under /root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.testing.mounts import loop_mount, require_loop_mounts
from kvtier.testing.users import as_nobody, root_owned_dir

SCRIPT = shutil.which("kvtier", path=str(Path(sys.executable).parent))
ENTRY = "from kvtier.cli.main import app; app()"


def kvtier(cwd: Path, *args: str) -> tuple[int, str, str]:
    """Run ``kvtier ARGS`` in ``cwd``; (exit code, stdout, stderr)."""
    cmd = [SCRIPT, *args] if SCRIPT else [sys.executable, "-c", ENTRY, *args]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "KVTIER_CACHE_DIR": str(cwd / "cache"),
        "COLUMNS": "400",
    }
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def assert_refused(result: tuple[int, str, str], path: str, cwd: Path) -> str:
    """Exit 2, exactly one stderr line naming ``path``, no traceback, ``cwd`` left empty."""
    code, out, err = result
    assert "Traceback" not in out + err, err
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and repr(path) in lines[0], lines[0]
    assert out == ""
    assert sorted(p.name for p in cwd.iterdir()) == [], "something was made before the refusal"
    return lines[0]


@pytest.fixture
def work(tmp_path) -> Path:
    """An empty working directory for the command."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return cwd


@pytest.fixture
def a_file(tmp_path) -> Path:
    """A regular file, where a directory is expected."""
    file = tmp_path / "a-file"
    file.write_bytes(b"not a directory")
    return file


def cases(a_file: Path) -> list[tuple[list[str], str, str]]:
    """(arguments, the path the message must name, a word of the reason)."""
    under = f"{a_file}/x"
    return [
        (["plan", "--plot", "/proc/kvtier-plan.png"], "/proc/kvtier-plan.png", "pseudo"),
        (["plan", "--plot", f"{under}.png"], f"{under}.png", "lies under"),
        (["plan", "--plot", "/sys/kvtier-plan.png", "--json"], "/sys/kvtier-plan.png", "pseudo"),
        (["bench", "storage", "--dir", under], under, "lies under"),
        (["bench", "storage", "--dir", "/proc/kvtier-bench"], "/proc/kvtier-bench", "pseudo"),
        (["bench", "storage", "--tier", f"file://{under}?size=1MiB"], under, "lies under"),
        (["bench", "storage", "--tier", "slab:///proc/kv?size=1MiB"], "/proc/kv", "pseudo"),
        (["bench", "storage", "--plot", "/proc/kvtier.png"], "/proc/kvtier.png", "pseudo"),
        (["bench", "ttft", "--dir", str(a_file)], str(a_file), "regular file"),
        (["run", "--engine", "hf", "--tier", f"file://{under}?size=1MiB"], under, "lies under"),
        (
            ["run", "--engine", "hf", "--tier", "slab:///proc/kvtier-run?size=1MiB"],
            "/proc/kvtier-run",
            "pseudo",
        ),
        (["run", "--disk-dir", str(a_file)], str(a_file), "regular file"),
        (["run", "--disk-dir", "/sys/kvtier-run"], "/sys/kvtier-run", "pseudo"),
        (["run", "--plot", under], under, "lies under"),
        (["calibrate", "--out", "/proc/kvtier.json"], "/proc/kvtier.json", "pseudo"),
        (["calibrate", "--out", f"{under}/p.json"], f"{under}/p.json", "lies under"),
        (["calibrate", "--tier", f"slab://{a_file}?size=1MiB"], str(a_file), "regular file"),
        (["calibrate", "--dir", under], under, "lies under"),
    ]


@pytest.mark.parametrize("index", range(len(cases(Path("/f")))))
def test_bad_path_is_one_line_exit_2(work, a_file, index):
    args, path, reason = cases(a_file)[index]
    line = assert_refused(kvtier(work, *args), path, work)
    assert reason in line


def test_run_refuses_bad_sizes_before_the_model(work):
    code, _, err = kvtier(work, "run", "--disk-size", "lots")
    assert code == 2 and err.splitlines() == [err.strip()] and "Traceback" not in err
    assert err.startswith("error: --disk-size: cannot read size 'lots'")


def test_hf_run_refuses_an_unknown_dtype_before_torch(work):
    code, _, err = kvtier(work, "run", "--engine", "hf", "--dtype", "fp4")
    assert code == 2 and err.splitlines() == [err.strip()] and "Traceback" not in err
    assert err.startswith("error: --dtype: unknown model dtype 'fp4'")


def test_run_refuses_an_unknown_tier_scheme_before_the_model(work):
    code, _, err = kvtier(work, "run", "--engine", "hf", "--tier", "nope://host/x?size=1MiB")
    assert code == 2 and err.splitlines() == [err.strip()] and "no tier for scheme 'nope'" in err


def test_a_read_only_mount(work):
    require_loop_mounts()
    with loop_mount(4 << 20, readonly=True) as root:
        for args, path in (
            (["bench", "storage", "--dir", f"{root}/kv"], f"{root}/kv"),
            (["run", "--engine", "hf", "--tier", f"file://{root}/kv?size=1MiB"], f"{root}/kv"),
            (["plan", "--plot", f"{root}/plan.png"], f"{root}/plan.png"),
        ):
            line = assert_refused(kvtier(work, *args), path, work)
            assert "read-only filesystem" in line


# --- as a user without write permission ---------------------------------------------------------


def cli_as_nobody(cwd: Path, *args: str) -> tuple[int, str, str]:
    """Run the CLI's entry point in a forked child as nobody:nogroup; (exit code, "", stderr).

    The child may not read the standard library under /root, so the same command first runs
    here with its last argument (the path) on /proc, refused at the same step: the child then
    finds every module it needs loaded.
    """
    from kvtier.cli.main import app

    argv = sys.argv
    sys.argv = ["kvtier", *args[:-1], "/proc/kvtier-warm/x.png"]
    try:
        with pytest.raises(SystemExit):
            app()
    finally:
        sys.argv = argv
    if os.geteuid() != 0:
        pytest.skip("needs root: makes a root-owned directory and drops to nobody")

    def cli() -> None:
        os.chdir(cwd)
        sys.argv = ["kvtier", *args]
        app()

    got = as_nobody(cli)
    return got.exit_code, "", got.stderr


@pytest.fixture
def root_owned() -> Iterator[Path]:
    """A directory owned by root, mode 0o755 (with ``cwd/`` inside): nobody can reach it but
    not write in it."""
    with root_owned_dir() as locked:
        (locked / "cwd").mkdir(mode=0o755)
        yield locked


@pytest.mark.parametrize(
    "args",
    [["plan", "--plot", "{d}/plan.png"], ["bench", "storage", "--dir", "{d}/bench"]],
)
def test_no_write_permission(root_owned, args):
    cwd = root_owned / "cwd"
    args = [a.format(d=root_owned) for a in args]
    line = assert_refused(cli_as_nobody(cwd, *args), args[-1], cwd)
    assert "not writable by uid 65534" in line
    assert sorted(p.name for p in root_owned.iterdir()) == ["cwd"]
