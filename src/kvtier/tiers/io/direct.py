"""Whether a tier's directory takes O_DIRECT (tmpfs, for one, refuses it with EINVAL)."""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from kvtier.errors import ConfigError

O_DIRECT = getattr(os, "O_DIRECT", 0)


def o_direct_refusal(root: Path, shown: str) -> str | None:
    """Why files in ``root`` cannot use O_DIRECT (a note naming ``shown``), or None if they can.

    Other errors than the filesystem's EINVAL are raised: they are not about O_DIRECT.
    """
    if not O_DIRECT:
        return "this platform has no O_DIRECT: buffered I/O"
    probe = root / f".odirect-probe.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return f"{shown} does not support O_DIRECT: buffered I/O (page cache)"
    os.close(fd)
    probe.unlink(missing_ok=True)
    return None


def resolve_direct(direct: bool | None, root: Path, shown: str) -> tuple[bool, str | None]:
    """A tier's ``direct=`` option resolved: (use O_DIRECT, a note for the user or None).

    ``None`` (auto) probes ``root``; ``True`` on a platform without O_DIRECT is a ConfigError.
    """
    if direct is None:
        refusal = o_direct_refusal(root, shown)
        return refusal is None, refusal
    if direct and not O_DIRECT:
        raise ConfigError("direct=1: this platform has no O_DIRECT; use direct=0")
    return bool(direct), None


__all__ = ["O_DIRECT", "o_direct_refusal", "resolve_direct"]
