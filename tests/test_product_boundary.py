"""What a serving deployment loads: the connector and the cache, none of the instruments.

Importing vLLM's KV connector or the cache must load no module of the instruments (workloads,
the vLLM harness, the simulator, the planner, the benchmarks, the main job, the test suites,
the CLI), nor their libraries (matplotlib, typer, rich), so the product serves without them.
Each import runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

INSTRUMENT_PREFIXES = (  # the rooms docs/ARCHITECTURE.md does not name as product rooms
    "kvtier.workloads",
    "kvtier.harness",
    "kvtier.sim",
    "kvtier.plan",
    "kvtier.bench",
    "kvtier.job",
    "kvtier.testing",
    "kvtier.cli",
)
INSTRUMENT_LIBRARIES = ("matplotlib", "typer", "rich")

_CHILD = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(module: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, module], capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "module",
    [
        "kvtier.cache",
        "kvtier.tiers.registry",
        pytest.param("kvtier.engines.vllm.connector", marks=pytest.mark.slow),  # imports vLLM
    ],
)
def test_the_product_loads_no_instrument(module):
    if module.startswith("kvtier.engines.vllm"):
        pytest.importorskip("vllm")
    loaded = _loaded(module)
    assert module in loaded
    instruments = sorted(
        m
        for m in loaded
        if m.startswith(INSTRUMENT_PREFIXES) or m.split(".")[0] in INSTRUMENT_LIBRARIES
    )
    assert instruments == []


def test_the_cache_alone_loads_no_yaml():
    """pyyaml comes in only with vLLM, which loads it itself."""
    assert "yaml" not in _loaded("kvtier.cache")


def test_the_instruments_here_are_the_rooms_the_doc_does_not_name_product():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    rooms = set(re.findall(r"^\| `(\w+)` \|", doc, re.M))
    line = re.search(r"^Product rooms \([^)]*\):([^.]*)\.", doc, re.M | re.S)
    assert line is not None
    product = set(re.findall(r"`(\w+)`", line.group(1)))
    instruments = {p.removeprefix("kvtier.") for p in INSTRUMENT_PREFIXES}
    assert product and instruments == rooms - product - {"tiers.ledger"}
