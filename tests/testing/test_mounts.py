"""loop_mount: a real filesystem per test, always torn down (mount, loop device, image)."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from kvtier.testing.mounts import (
    LoopMountError,
    loop_mount,
    loop_mount_available,
    require_loop_mounts,
)


@pytest.fixture(autouse=True)
def loop_mounts() -> None:
    """Loop mounts must work here (KVTIER_ALLOW_SKIP_MOUNTS=1 makes their absence a skip)."""
    require_loop_mounts()


def mounted(path) -> bool:
    """Whether ``path`` is a mount point in /proc/self/mountinfo."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def loop_backing(path) -> bool:
    """Whether any loop device is attached to the image file ``path``."""
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return str(path) in out


def test_available_here():
    assert loop_mount_available() is None


def test_mount_size_type_and_teardown():
    with loop_mount(8 << 20) as root:
        st = os.statvfs(root)
        assert mounted(root) and loop_backing(root.parent / "image")
        assert 6 << 20 < st.f_blocks * st.f_frsize <= 8 << 20
        assert not st.f_flag & os.ST_RDONLY
        (root / "data").write_bytes(b"kv" * 1000)
    assert not mounted(root) and not loop_backing(root.parent / "image")
    assert not root.parent.exists()


def test_teardown_when_the_body_raises_with_a_file_open():
    with pytest.raises(KeyError), loop_mount(4 << 20) as root:
        handle = open(root / "busy", "wb")  # noqa: SIM115 - keeps the mount busy: a lazy unmount
        raise KeyError("body")
    handle.close()
    assert not mounted(root) and not loop_backing(root.parent / "image")
    assert not root.parent.exists()


def test_read_only():
    with loop_mount(4 << 20, readonly=True) as root:
        assert os.statvfs(root).f_flag & os.ST_RDONLY
        with pytest.raises(OSError) as info:
            (root / "x").write_bytes(b"x")
        assert info.value.errno == errno.EROFS


def test_inodes_run_out():
    with loop_mount(16 << 20, inodes=40) as root:
        total = os.statvfs(root).f_files
        assert total < 200  # the default for 16 MiB is 4096
        made = 0
        with pytest.raises(OSError) as info:
            while True:
                (root / f"f{made}").touch()
                made += 1
        assert info.value.errno == errno.ENOSPC and 0 < made < total
        assert os.statvfs(root).f_bfree > 1000  # blocks were left: the inodes ran out


def test_bad_arguments_and_a_failing_mkfs():
    with pytest.raises(ValueError), loop_mount(0):
        pass
    with pytest.raises(ValueError), loop_mount(1 << 20, fstype="xfs", inodes=10):
        pass
    with pytest.raises(LoopMountError, match="mkfs failed"), loop_mount(16 << 10):
        pass
