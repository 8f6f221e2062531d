"""What a serving deployment loads: the connector and the cache, none of the instruments.

Importing vLLM's KV connector or the cache must load no module of the benchmarks, the main
job's harness, the simulator, the planner or the CLI, nor their libraries (matplotlib, typer,
rich), so the product serves without them. Each import runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

INSTRUMENT_PREFIXES = (
    "kvtier.bench",
    "kvtier.job",
    "kvtier.harness",
    "kvtier.sim",
    "kvtier.plan",
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
