"""The policies the live cache runs load on their own: no tiers, cache, engines or run."""

from __future__ import annotations

import json
import subprocess
import sys


def test_policies_import_without_the_rooms_that_use_them():
    code = (
        "import json, sys\n"
        "import kvtier.policy.admission, kvtier.policy.eviction, kvtier.policy.decision\n"
        "import kvtier.policy.reuse\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kvtier'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "kvtier.policy.reuse" in loaded
    for room in ("kvtier.tiers", "kvtier.cache", "kvtier.engines", "kvtier.job"):
        assert not [m for m in loaded if m == room or m.startswith(room + ".")], (room, loaded)


def test_the_ledger_imports_no_io_code():
    code = (
        "import json, sys\n"
        "import kvtier.tiers.ledger\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kvtier.tiers'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert "kvtier.tiers.ledger" in loaded
    assert not [m for m in loaded if m.startswith(("kvtier.tiers.io", "kvtier.tiers.files"))]
    assert not [m for m in loaded if m.startswith("kvtier.tiers.memory")]
