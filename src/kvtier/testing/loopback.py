"""Keep a test server that listens on every interface to loopback: a ``bind()`` shim for
``LD_PRELOAD``.

Some servers take no address for some of their listeners: Mooncake's transfer engine binds its
handshake and data ports to ``INADDR_ANY``/``in6addr_any`` whatever it is told, and its master's
HTTP metadata server ignores ``-http_metadata_server_host``. The shim, built once per directory
with the system's C compiler, turns a bind to the wildcard address into a bind to 127.0.0.1
(``::ffff:127.0.0.1`` on a dual-stack IPv6 socket), and leaves every other bind alone.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from kvtier.errors import KvtierError

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real;
    if (!real) real = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
            static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                     0, 0, 0xff, 0xff, 127, 0, 0, 1};
            memcpy(&a.sin6_addr, mapped, sizeof mapped);
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real(fd, addr, len);
}
"""


class ShimError(KvtierError):
    """The loopback shim could not be built (no C compiler, or it failed)."""


def loopback_shim(directory: Path, compiler: str = "cc") -> Path:
    """The shim's shared library in ``directory``, built there unless it already is."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    library = directory / f"loopback-bind-{digest}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"loopback-bind-{digest}.c"
    source.write_text(SOURCE)
    partial = library.with_suffix(".so.part")
    try:
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError as exc:
        raise ShimError(f"no C compiler ({compiler}) for the loopback shim: {exc}") from None
    if done.returncode != 0:
        raise ShimError(f"the loopback shim did not build:\n{done.stderr[-2000:]}")
    partial.replace(library)
    return library


def main(argv: list[str] | None = None) -> int:
    """``python -m kvtier.testing.loopback DIR``: build the shim in DIR, print its path (the
    test runner preloads it into every process of the suite)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kvtier.testing.loopback DIR", file=sys.stderr)
        return 2
    try:
        print(loopback_shim(Path(args[0]).absolute()))
    except ShimError as exc:
        print(str(exc).splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["SOURCE", "ShimError", "loopback_shim", "main"]
