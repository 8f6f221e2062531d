"""The tier registry: read-only built-ins, lazy options classes, and out-of-tree tiers found
through the ``kvtier.tiers`` entry points of a real (tiny) installed distribution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.tiers.files.options import PerBlockOptions, SlabOptions
from kvtier.tiers.memory.options import MemoryOptions
from kvtier.tiers.redis.options import RedisOptions
from kvtier.tiers.registry import REGISTRY, options_class, tier_class
from kvtier.tiers.s3.options import S3Options


def _python(code: str, path: Path | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (``path`` first on sys.path); its JSON output."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_builtin_table_is_read_only():
    with pytest.raises(TypeError):
        REGISTRY["mine"] = ("x:Y", None, None)  # type: ignore[index]


def test_options_class_of_builtins():
    assert options_class("memory") is MemoryOptions
    assert options_class("file") is PerBlockOptions
    assert options_class("slab") is SlabOptions
    assert options_class("redis") is RedisOptions is options_class("rediss")
    assert options_class("valkey") is RedisOptions
    assert options_class("s3") is S3Options
    with pytest.raises(ConfigError, match="no tier for scheme 'nosuch'; known: file, memory"):
        options_class("nosuch")


def test_options_classes_load_without_their_tiers():
    got = _python(
        """
        import json, sys
        from kvtier.tiers.registry import options_class
        classes = [options_class(s).__name__ for s in ("memory", "file", "slab", "redis", "s3")]
        tiers = [m for m in ("kvtier.tiers.memory.tier", "kvtier.tiers.files.per_block",
                             "kvtier.tiers.files.slab", "kvtier.tiers.io.backends",
                             "kvtier.tiers.redis.tier", "kvtier.tiers.s3.tier", "redis",
                             "obstore")
                 if m in sys.modules]
        print(json.dumps({"classes": classes, "tiers": tiers}))
        """
    )
    assert got == {
        "classes": ["MemoryOptions", "PerBlockOptions", "SlabOptions", "RedisOptions", "S3Options"],
        "tiers": [],
    }


def _distribution(site: Path) -> None:
    """A tiny installed distribution: a package and its dist-info with entry points."""
    package = site / "mytier_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A tier out of kvtier's tree: the memory tier under another scheme."""
            from kvtier.tiers.memory.options import MemoryOptions
            from kvtier.tiers.memory.tier import MemoryTier


            class MyTier(MemoryTier):
                """memory:// under the scheme mytier://."""

                scheme = "mytier"
                Options = MemoryOptions


            class NotATier:
                """Registered by mistake."""
            '''
        )
    )
    info = site / "mytier_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mytier-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[kvtier.tiers]\n"
        "mytier = mytier_pkg:MyTier\n"
        "memory = mytier_pkg:NotATier\n"  # a built-in scheme is never shadowed
        "notatier = mytier_pkg:NotATier\n"
        "broken = mytier_pkg.gone:Tier\n"
    )
    (info / "RECORD").write_text("")


def test_entry_point_tier_opens_by_url(tmp_path):
    site = tmp_path / "site"
    _distribution(site)
    got = _python(
        """
        import json
        from kvtier.errors import ConfigError
        from kvtier.tiers.registry import open_tier, options_class, tier_class
        from kvtier.tiers.registry import replace_options

        tier = open_tier("mytier://?size=1MiB&name=mine", bytes(range(16)))
        out = {"type": type(tier).__name__, "base": type(tier).__mro__[1].__name__,
               "name": tier.name, "capacity": tier.usage().capacity_bytes,
               "memory": tier_class("memory").__name__,
               "options": options_class("mytier").__name__,
               "roomier": replace_options("mytier://?size=1MiB&name=mine", size=2 << 20)}
        tier.close()
        for scheme in ("notatier", "broken", "nosuch"):
            try:
                tier_class(scheme)
            except ConfigError as exc:
                out[scheme] = str(exc)
        print(json.dumps(out))
        """,
        site,
    )
    assert got["type"] == "MyTier" and got["base"] == "MemoryTier"
    assert got["name"] == "mine" and got["capacity"] == 1 << 20
    assert got["memory"] == "MemoryTier"
    assert got["options"] == "MemoryOptions"
    assert got["roomier"] == "mytier://?size=2MiB&name=mine"
    assert "is not a Tier class" in got["notatier"]
    assert "mytier_pkg.gone:Tier" in got["broken"] and "does not load" in got["broken"]
    assert "mytier-pkg" in got["broken"]
    assert "known:" in got["nosuch"] and "mytier" in got["nosuch"]
    assert "\n" not in got["broken"]


def test_without_the_distribution_the_scheme_is_unknown():
    with pytest.raises(ConfigError, match="no tier for scheme 'mytier'"):
        tier_class("mytier")
