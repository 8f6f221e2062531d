"""usable_directory / writable_file / check_tier_url against real files, mounts and users."""

from __future__ import annotations

import errno
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier.errors import ConfigError, KvtierError, TierPathError
from kvtier.testing.mounts import loop_mount, require_loop_mounts
from kvtier.testing.users import as_nobody, root_owned_dir
from kvtier.tiers.paths import usable_directory, writable_file
from kvtier.tiers.registry import check_tier_url

LONG_NAME = "n" * 256
DEEP = "/".join(["d" * 200] * 21)  # 4220 bytes: every name fits, the path does not


def refused(reason: str, call: Callable[[], object]) -> TierPathError:
    """The TierPathError ``call`` raises; its reason must be ``reason``, its message one line."""
    with pytest.raises(TierPathError) as info:
        call()
    err = info.value
    assert err.reason == reason, str(err)
    assert "\n" not in str(err) and str(err)
    return err


def nobody_refusal(fn: Callable[[], object]) -> TierPathError | None:
    """The TierPathError ``fn()`` raises when run as nobody (None when it passes)."""
    got = as_nobody(fn, attrs=("path", "reason"))
    assert got.exit_code == 0, f"the child as nobody failed: {got.stderr}"
    if got.error is None:
        return None
    assert got.error == "TierPathError", (got.error, got.message)
    return TierPathError(got.message, got.attrs["path"], got.attrs["reason"])


@pytest.fixture
def root_owned() -> Iterator[Path]:
    """A directory owned by root, mode 0o755, that nobody can reach but not write."""
    with root_owned_dir() as locked:
        yield locked


@pytest.fixture
def loop_mounts() -> None:
    """Loop mounts must work here (KVTIER_ALLOW_SKIP_MOUNTS=1 makes their absence a skip)."""
    require_loop_mounts()


# --- good directories --------------------------------------------------------------------------


def test_a_new_directory_is_created_and_left_empty(tmp_path):
    target = tmp_path / "a" / "b" / "kv"
    got = usable_directory(target)
    assert got == target and got.is_absolute() and target.is_dir()
    assert list(target.iterdir()) == []  # the probe file is gone


def test_keep_false_checks_without_leaving_directories(tmp_path):
    assert usable_directory(tmp_path / "x" / "y", keep=False) == tmp_path / "x" / "y"
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_passes_and_is_untouched(tmp_path):
    (tmp_path / "block").write_bytes(b"kv")
    assert usable_directory(tmp_path, keep=False) == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == ["block"]


def test_a_relative_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert usable_directory("rel/kv") == tmp_path / "rel" / "kv"


# --- bad directories ---------------------------------------------------------------------------


def test_a_regular_file(tmp_path):
    file = tmp_path / "file"
    file.write_bytes(b"x")
    err = refused("not-a-directory", lambda: usable_directory(file))
    assert str(file) in str(err) and "is a regular file" in str(err)
    assert err.path == str(file) and isinstance(err, ConfigError | KvtierError)


def test_a_path_under_a_regular_file(tmp_path):
    file = tmp_path / "file"
    file.write_bytes(b"x")
    err = refused("not-a-directory", lambda: usable_directory(file / "a" / "b"))
    assert f"lies under '{file}', which is a regular file" in str(err)


@pytest.mark.parametrize("path", ["/proc/kvtier-test", "/proc", "/sys/kernel/kvtier-test"])
def test_a_pseudo_filesystem(path):
    err = refused("pseudo-fs", lambda: usable_directory(path))
    assert repr(path) in str(err) and "pseudo filesystem" in str(err)
    assert "/proc" in str(err) or "/sys" in str(err)
    assert path == "/proc" or not os.path.exists(path)


def test_a_read_only_mount(loop_mounts):
    with loop_mount(4 << 20, readonly=True) as root:
        assert os.statvfs(root).f_flag & os.ST_RDONLY  # really mounted read-only
        for target in (root, root / "sub" / "kv"):
            err = refused("read-only", lambda t=target: usable_directory(t))
            assert repr(str(target)) in str(err) and f"mounted at {root}" in str(err)
        assert not (root / "sub").exists()


def test_a_directory_nobody_may_not_write(root_owned):
    assert root_owned.stat().st_uid == 0 and root_owned.stat().st_mode & 0o777 == 0o755
    for target in (root_owned, root_owned / "sub"):
        err = nobody_refusal(lambda t=target: usable_directory(t))
        assert isinstance(err, TierPathError) and err.reason == "permission", err
        assert repr(str(target)) in str(err) and "not writable by uid 65534" in str(err)
    assert list(root_owned.iterdir()) == []
    # nobody may use a folder it can write (the sticky /tmp): the refusal above is about the mode
    ok = Path("/tmp/kvtier-nobody-ok")
    assert nobody_refusal(lambda: usable_directory(ok, keep=False)) is None
    assert not Path("/tmp/kvtier-nobody-ok").exists()


def test_a_name_too_long(tmp_path):
    refused("too-long", lambda: usable_directory(tmp_path / LONG_NAME))
    refused("too-long", lambda: usable_directory(tmp_path / "ok" / LONG_NAME / "x"))
    assert list(tmp_path.iterdir()) == []  # nothing created before the long name


def test_a_path_too_long(tmp_path):
    err = refused("too-long", lambda: usable_directory(tmp_path / DEEP))
    assert "bytes)" in str(err) and len(str(err)) < 400  # the path is shortened in the message
    assert list(tmp_path.iterdir()) == []


def test_a_nul_byte(tmp_path):
    err = refused("nul", lambda: usable_directory(f"{tmp_path}/a\x00b"))
    assert "\\x00" in str(err) and "\x00" not in str(err)


def test_an_empty_path():
    refused("empty", lambda: usable_directory(""))


def test_the_error_pickles_with_its_path_and_reason(tmp_path):
    err = refused("nul", lambda: usable_directory("a\x00"))
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.path, back.reason) == (str(err), err.path, err.reason)


# --- a full filesystem is usable (the tier evicts), a directory that cannot be made is not ------


def _fill_inodes(root: Path) -> int:
    made = 0
    try:
        while True:
            (root / f"i{made}").touch()
            made += 1
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    return made


def test_no_inodes_left_passes_an_existing_directory_but_not_a_new_one(loop_mounts):
    with loop_mount(8 << 20, inodes=64) as root:
        assert os.statvfs(root).f_files < 200  # inodes= reached mkfs
        assert _fill_inodes(root) > 0 and os.statvfs(root).f_favail == 0
        assert usable_directory(root) == root
        err = refused("no-space", lambda: usable_directory(root / "new"))
        assert "filesystem is full" in str(err)


def test_no_blocks_left_passes(loop_mounts):
    with loop_mount(4 << 20, mkfs_options=("-m", "0")) as root:
        with open(root / "fill", "wb") as f:
            chunk = b"\xff" * (1 << 16)
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        assert usable_directory(root) == root
        assert sorted(p.name for p in root.iterdir()) == ["fill", "lost+found"]


# --- writable_file -----------------------------------------------------------------------------


def test_writable_file_accepts_new_and_existing_files(tmp_path):
    assert writable_file(tmp_path / "out.png") == tmp_path / "out.png"
    assert not (tmp_path / "out.png").exists()
    (tmp_path / "old.png").write_bytes(b"keep")
    writable_file(tmp_path / "old.png")
    assert (tmp_path / "old.png").read_bytes() == b"keep"  # not truncated


def test_writable_file_refusals(tmp_path):
    file = tmp_path / "file"
    file.write_bytes(b"x")
    refused("is-a-directory", lambda: writable_file(tmp_path, "--plot"))
    err = refused("missing", lambda: writable_file(tmp_path / "no" / "x.png", "--plot"))
    assert str(err).startswith("--plot ") and "does not exist" in str(err)
    refused("not-a-directory", lambda: writable_file(file / "x.png"))
    refused("pseudo-fs", lambda: writable_file("/proc/x.png"))
    refused("nul", lambda: writable_file("x\x00.png"))


def test_writable_file_parents_leaves_nothing(tmp_path):
    assert writable_file(tmp_path / "a" / "b" / "p.json", parents=True)
    assert list(tmp_path.iterdir()) == []


def test_writable_file_a_read_only_file_for_nobody(root_owned):
    base = root_owned.parent
    file = base / "ro.png"
    file.write_bytes(b"x")
    file.chmod(0o644)
    base.chmod(0o777)  # the folder is writable, the file is not
    try:
        err = nobody_refusal(lambda: writable_file(file))
    finally:
        base.chmod(0o755)
        file.unlink()
    assert isinstance(err, TierPathError) and err.reason == "permission", err


# --- check_tier_url ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["file", "slab"])
def test_check_tier_url_accepts_a_good_directory_and_leaves_nothing(tmp_path, scheme):
    check_tier_url(f"{scheme}://{tmp_path}/new/kv?size=1MiB")
    assert list(tmp_path.iterdir()) == []  # not opened, nothing made


def test_check_tier_url_other_schemes():
    check_tier_url("memory://?size=8MiB")
    with pytest.raises(ConfigError, match="no tier for scheme 'nope'"):
        check_tier_url("nope:///x?size=1MiB")
    with pytest.raises(ConfigError, match="has no scheme"):
        check_tier_url("/just/a/path")
    with pytest.raises(ConfigError, match="size='lots': use a size"):
        check_tier_url("memory://?size=lots")


@pytest.mark.parametrize("scheme", ["file", "slab"])
def test_check_tier_url_malformed(tmp_path, scheme):
    with pytest.raises(ConfigError, match="names host 'tmp'"):
        check_tier_url(f"{scheme}://tmp/kv?size=1MiB")
    with pytest.raises(ConfigError, match=r"needs \?size=\.\.\., e\.g\. "):
        check_tier_url(f"{scheme}://{tmp_path}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("scheme", ["file", "slab"])
def test_check_tier_url_bad_directories(tmp_path, scheme):
    file = tmp_path / "file"
    file.write_bytes(b"x")
    cases = {
        str(file): "not-a-directory",
        f"{file}/kv": "not-a-directory",
        "/proc/kvtier-test": "pseudo-fs",
        f"{tmp_path}/{LONG_NAME}": "too-long",
        f"{tmp_path}/{DEEP}": "too-long",
        f"{tmp_path}/a\x00b": "nul",
    }
    for path, reason in cases.items():
        err = refused(reason, lambda p=path: check_tier_url(f"{scheme}://{p}?size=1MiB"))
        assert str(err).startswith(f"{scheme}:// tier directory ")


def test_check_tier_url_read_only(loop_mounts):
    with loop_mount(4 << 20, readonly=True) as root:
        refused("read-only", lambda: check_tier_url(f"slab://{root}/kv?size=1MiB"))


def test_check_tier_url_not_writable(root_owned):
    err = nobody_refusal(lambda: check_tier_url(f"file://{root_owned}/kv?size=1MiB"))
    assert isinstance(err, TierPathError) and err.reason == "permission", err


def test_a_folder_another_check_removes_under_this_one_is_made_again(tmp_path, monkeypatch):
    """Two processes checking one new folder without keeping it (an engine's ranks at start-up):
    the first removes it after its probe, between the second's mkdir and probe. The second
    makes it again instead of refusing it."""
    from kvtier.tiers import paths

    target = tmp_path / "new" / "tier"
    real, calls = paths._probe, []

    def probe_after_a_rival(directory: str, subject: str, raw: str) -> None:
        calls.append(directory)
        if len(calls) == 1:  # the rival's clean-up lands first
            os.rmdir(directory)
        real(directory, subject, raw)

    monkeypatch.setattr(paths, "_probe", probe_after_a_rival)
    assert usable_directory(target) == target and target.is_dir()
    assert len(calls) == 2
