"""The loopback shim: a process it is preloaded into binds the wildcard address to loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from kvtier.testing.loopback import loopback_shim

PROBE = textwrap.dedent(
    """
    import json, socket
    out = {}
    for name, family, address in (
        ("v4 any", socket.AF_INET, ("0.0.0.0", 0)),
        ("v4 other", socket.AF_INET, ("127.0.0.2", 0)),
        ("v6 any", socket.AF_INET6, ("::", 0)),
    ):
        s = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(address)
        s.listen()
        out[name] = s.getsockname()[0]
        s.close()
    print(json.dumps(out))
    """
)


def test_the_shim_turns_wildcard_binds_into_loopback_ones(tmp_path):
    shim = loopback_shim(tmp_path)
    assert loopback_shim(tmp_path) == shim  # built once
    env = {**os.environ, "LD_PRELOAD": str(shim)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "v4 any": "127.0.0.1",
        "v4 other": "127.0.0.2",  # an address of its own is left alone
        "v6 any": "::ffff:127.0.0.1",
    }
