"""The rooms' direct imports, checked against docs/ARCHITECTURE.md (the one source of the rules).

The doc's rooms table says which room may import which; its narrower table restricts parts of a
room (``tiers.ledger``); its "Core rooms" line names the rooms that must not import an engine
library at module top level; its "Known exceptions" section lists the forbidden edges the code
still has. Every ``kvtier`` import under src/kvtier is read with :mod:`ast`: top-level ones,
those inside functions and under ``if TYPE_CHECKING:`` (an annotation-only edge is still an
edge of the design), ``importlib.import_module`` names and ``"kvtier.x.y:Name"`` entry strings.
The same edges, module to module, must hold no circle (:mod:`graphlib` finds them).

import-linter (grimp) reads the static imports too, but cannot tell a module-level import from
one inside a function (the engine-library rule) nor read dynamic names and entry strings, so the
checker reads the code with :mod:`ast` itself.
"""

from __future__ import annotations

import ast
import graphlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ARCHITECTURE.md"
PACKAGE = REPO / "src" / "kvtier"
ROOMS_HEADER = ("room", "what lives there", "may import")
NARROW_HEADER = ("module", "may import")
ENGINE_LIBS = ("torch", "transformers", "vllm")
VLLM_ROOMS = {"engines", "harness"}  # the connector, and vLLM driven as an instrument


# --- the rules, parsed from the doc -------------------------------------------------------------
@dataclass
class Rules:
    """What the doc allows."""

    order: list[str]  # rooms, in table order
    allowed: dict[str, set[str]]  # room -> rooms it may import (besides itself and universal)
    universal: set[str]  # rooms every room may import
    narrow: dict[str, set[str]]  # "room.module" -> rooms it may import
    core: set[str]
    exceptions: set[tuple[str, str, str]] = field(default_factory=set)  # (src, dst, path)
    product: set[str] = field(
        default_factory=set
    )  # what a deployment imports; the rest: instruments


def _tables(text: str) -> list[tuple[tuple[str, ...], list[list[str]]]]:
    tables: list[tuple[tuple[str, ...], list[list[str]]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        line = line.strip()
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows:
            tables.append((tuple(rows[0]), rows[1:]))
            rows = []
    return tables


def _names(cell: str) -> list[str]:
    names = re.findall(r"`([\w.]+)`", cell)
    if not names or re.sub(r"`[\w.]+`|[,\s]", "", cell):
        raise ValueError(f"cannot read {cell!r}: write `room`, `room`, … or — or every room above")
    return names


def _table(text: str, header: tuple[str, ...]) -> list[list[str]]:
    for head, rows in _tables(text):
        if head == header:
            return rows
    raise ValueError(f"docs/ARCHITECTURE.md has no table with columns {' | '.join(header)}")


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise ValueError(f"docs/ARCHITECTURE.md has no section '## {title}'")
    return match.group(1)


def parse_rules(text: str) -> Rules:
    """The rules the doc states (raises ValueError where it cannot read them)."""
    order: list[str] = []
    allowed: dict[str, set[str]] = {}
    for row in _table(text, ROOMS_HEADER):
        (room,) = _names(row[0])
        may = row[2]
        if may in ("—", "-", ""):
            allowed[room] = set()
        elif may == "every room above":
            allowed[room] = set(order)
        else:
            allowed[room] = set(_names(may))
        order.append(room)
    narrow = {_names(r[0])[0]: set(_names(r[1])) for r in _table(text, NARROW_HEADER)}
    universal = set(re.findall(r"`(\w+)` may be imported by every room", text))
    core_line = re.search(r"^Core rooms \([^)]*\):((?:[\s,]*`\w+`)+)", text, re.M)
    if core_line is None:
        raise ValueError("docs/ARCHITECTURE.md has no 'Core rooms (…): `a`, `b`.' line")
    core = set(re.findall(r"`(\w+)`", core_line.group(1)))
    exceptions = set()
    for line in _section(text, "Known exceptions").splitlines():
        m = re.match(r"^- `([\w.]+) -> ([\w.]+)` in `([^`]+)`:", line)
        if m:
            exceptions.add((m.group(1), m.group(2), m.group(3)))
    product_line = re.search(r"^Product rooms \([^)]*\):((?:[\s,]*`\w+`)+)", text, re.M)
    product = set(re.findall(r"`(\w+)`", product_line.group(1))) if product_line else set()
    return Rules(order, allowed, universal, narrow, core, exceptions, product)


# --- the imports, read from the code ----------------------------------------------------------
@dataclass(frozen=True)
class Import:
    """One import of a module by a file (``path`` relative to the package's parent)."""

    path: str
    line: int
    module: str  # absolute dotted name
    executed_on_import: bool  # at module level and not under TYPE_CHECKING


def _module_name(root: Path, file: Path) -> str:
    parts = list(file.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(root: Path, dotted: str) -> bool:
    """A module of the package: a .py file, a package, or a C extension built from its .c file."""
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    if (root / rel / "__init__.py").is_file():
        return True
    return any((root / rel).with_suffix(ext).is_file() for ext in (".py", ".c"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _nodes(node: ast.AST, executed: bool = True) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under ``node``, with whether it runs when the module is imported."""
    yield node, executed
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        executed = False
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.body:
            yield from _nodes(child, False)
        for child in node.orelse:
            yield from _nodes(child, executed)
        return
    for child in ast.iter_child_nodes(node):
        yield from _nodes(child, executed)


def _dynamic_name(node: ast.Call) -> str | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)  # f"kvtier.cli.{name}": the complete components
        return prefix.rsplit(".", 1)[0] if "." in prefix else None
    return None


def _entry_string(value: object) -> bool:
    """A registry's lazy ``"kvtier.x.y:Name"`` entry."""
    return isinstance(value, str) and re.fullmatch(r"kvtier(\.\w+)+:\w+", value) is not None


def read_imports(root: Path, file: Path) -> list[Import]:
    """Every import of a ``kvtier`` module in ``file`` (``root``: the kvtier package dir)."""
    rel = str(file.relative_to(root.parent))
    me = _module_name(root, file)
    package = me if file.name == "__init__.py" else me.rpartition(".")[0]
    found: dict[Import, None] = {}  # ordered, one entry per (line, module)

    def add(line: int, module: str, executed: bool) -> None:
        if module == "kvtier" or module.startswith("kvtier."):
            found[Import(rel, line, module, executed)] = None

    for node, executed in _nodes(ast.parse(file.read_text(encoding="utf-8"), rel)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node.lineno, alias.name, executed)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base_name = ".".join([*base, node.module] if node.module else base)
            else:
                base_name = node.module or ""
            for alias in node.names:
                sub = f"{base_name}.{alias.name}"
                add(node.lineno, sub if _exists(root, sub) else base_name, executed)
        elif isinstance(node, ast.Call) and (name := _dynamic_name(node)):
            add(node.lineno, name, False)
        elif isinstance(node, ast.Constant) and _entry_string(node.value):
            add(node.lineno, node.value.split(":")[0], False)
    return list(found)


def scan(root: Path) -> list[Import]:
    """The imports of every .py file under the package dir ``root``."""
    return [imp for f in sorted(root.rglob("*.py")) for imp in read_imports(root, f)]


def room_of_path(path: str) -> str | None:
    """``kvtier/cache/tiered.py`` → ``cache``; ``kvtier/keys.py`` → ``keys``; the root → None."""
    parts = Path(path).parts[1:]
    if parts == ("__init__.py",):
        return None
    return parts[0].removesuffix(".py")


def room_of_module(root: Path, module: str) -> str | None:
    """``kvtier.cache.tiered`` → ``cache``; ``kvtier`` (or a name of its __init__) → None."""
    parts = module.split(".")
    if len(parts) < 2 or not _exists(root, ".".join(parts[:2])):
        return None
    return parts[1]


# --- the checks ---------------------------------------------------------------------------------
def edge_violations(rules: Rules, root: Path, imports: list[Import]) -> tuple[list[str], set]:
    """Forbidden ``room -> room (file:line)`` edges, and the listed exceptions they used."""
    bad: list[str] = []
    used: set[tuple[str, str, str]] = set()
    for imp in imports:
        src, dst = room_of_path(imp.path), room_of_module(root, imp.module)
        if src is None or dst is None or src == dst or dst in rules.universal:
            continue
        if src not in rules.allowed:
            bad.append(f"{src} -> {dst} ({imp.path}:{imp.line}): room {src} is not in the table")
        elif dst not in rules.allowed[src]:
            key = (src, dst, imp.path)
            if key in rules.exceptions:
                used.add(key)
            else:
                bad.append(f"{src} -> {dst} ({imp.path}:{imp.line})")
    return bad, used


def narrow_violations(rules: Rules, root: Path, imports: list[Import]) -> tuple[list[str], set]:
    """Imports of a narrowly ruled module (``tiers.ledger*``) outside its own rule."""
    bad: list[str] = []
    used: set[tuple[str, str, str]] = set()
    for part, may in rules.narrow.items():
        room, _, name = part.partition(".")
        own = f"kvtier.{room}.{name}"
        prefix = str(Path(root.name, room, name))
        for imp in imports:
            if not imp.path.startswith(prefix):
                continue
            dst = room_of_module(root, imp.module)
            if imp.module.startswith(own) or dst is None or (dst != room and dst in may):
                continue
            label = imp.module.removeprefix("kvtier.") if dst == room else dst
            key = (part, label, imp.path)
            if key in rules.exceptions:
                used.add(key)
            else:
                bad.append(f"{part} -> {label} ({imp.path}:{imp.line}): only {sorted(may)}")
    return bad, used


def engine_violations(rules: Rules, root: Path) -> list[str]:
    """Core rooms importing torch/transformers/vllm on import; vllm anywhere but engines."""
    bad: list[str] = []
    for file in sorted(root.rglob("*.py")):
        rel = str(file.relative_to(root.parent))
        room = room_of_path(rel)
        tree = ast.parse(file.read_text(encoding="utf-8"), rel)
        for line, module, executed in _external_imports(tree):
            lib = module.split(".")[0]
            if lib not in ENGINE_LIBS:
                continue
            if room in rules.core and executed:
                bad.append(f"{room} imports {lib} at module top level ({rel}:{line})")
            if lib == "vllm" and room not in VLLM_ROOMS:
                bad.append(f"{room} imports vllm ({rel}:{line}); only {sorted(VLLM_ROOMS)} may")
    return bad


def _external_imports(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, module, executed on import) of every absolute import in ``tree``."""
    out: list[tuple[int, str, bool]] = []
    for node, executed in _nodes(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, executed) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node.lineno, node.module, executed))
    return out


def import_cycles(root: Path, imports: list[Import]) -> list[str]:
    """Circles among the package's modules (every edge counts: lazy, typed or dynamic), each as
    ``a -> b -> … -> a``; one per strongly connected group found."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        me = _module_name(root, root.parent / imp.path)
        if imp.module != me and not me.startswith(imp.module + "."):  # a package's own parent
            graph.setdefault(me, set()).add(imp.module)
    cycles: list[str] = []
    while True:
        try:
            graphlib.TopologicalSorter(graph).prepare()
            return cycles
        except graphlib.CycleError as exc:
            circle = exc.args[1]  # each an import of the next one's, first == last
            graph[circle[1]].discard(circle[0])  # to find the next one too
            ring = list(reversed(circle[:-1]))  # in import order, from the first name
            start = ring.index(min(ring))
            ring = ring[start:] + ring[:start]
            cycles.append(" -> ".join([*ring, ring[0]]))


def doc_violations(rules: Rules, root: Path) -> list[str]:
    """The doc against itself and the tree: rooms exist, layering, names known."""
    bad: list[str] = []
    rooms = set(rules.order)
    on_disk = {
        p.name.removesuffix(".py")
        for p in root.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }
    bad += [f"room {r} is in the table but not under {root.name}/" for r in rooms - on_disk]
    bad += [f"{r} exists under {root.name}/ but is not in the table" for r in on_disk - rooms]
    for i, room in enumerate(rules.order):
        for dst in sorted(rules.allowed[room] - set(rules.order[:i])):
            bad.append(f"the row of {room} allows {dst}, which is not a room above it")
    for name in sorted((rules.universal | rules.core) - rooms):
        bad.append(f"{name} is named in the rules but is not a room of the table")
    for part, may in rules.narrow.items():
        if part.split(".")[0] not in rooms or may - rooms:
            bad.append(f"the narrow rule of {part} names something that is not a room")
    for room in sorted(rules.product):
        if room not in rooms:
            bad.append(f"product room {room} is not a room of the table")
            continue
        for dst in sorted(rules.allowed[room] - rules.product - rules.universal):
            bad.append(f"product room {room} may import {dst}, an instrument")
    return bad


# --- the real tree ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rules() -> Rules:
    return parse_rules(DOC.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return scan(PACKAGE)


def test_doc_rooms_exist_and_are_layered(rules):
    assert "errors" in rules.universal
    assert {"cache", "tiers", "engines"} <= rules.product and "bench" not in rules.product
    assert not doc_violations(rules, PACKAGE), "\n".join(doc_violations(rules, PACKAGE))


def test_imports_follow_the_rooms_table(rules, imports):
    bad, used = edge_violations(rules, PACKAGE, imports)
    _, narrow_used = narrow_violations(rules, PACKAGE, imports)
    stale = rules.exceptions - used - narrow_used
    listing = "\n".join(bad)
    assert not bad, f"forbidden edges (fix them or list them under Known exceptions):\n{listing}"
    assert not stale, f"Known exceptions no longer in the code (remove them): {sorted(stale)}"


def test_ledger_imports_only_policy_specs_errors(rules, imports):
    assert "tiers.ledger" in rules.narrow
    ledgers = [p for p in (PACKAGE / "tiers").glob("ledger*") if p.suffix == ".py" or p.is_dir()]
    if not ledgers:
        pytest.skip("no tiers/ledger* module yet: the tiers.ledger rule has nothing to check")
    bad, _ = narrow_violations(rules, PACKAGE, imports)
    assert not bad, "\n".join(bad)


def test_no_import_circles_between_modules(imports):
    cycles = import_cycles(PACKAGE, imports)
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_core_imports_no_engine_library_on_import(rules):
    assert {"specs", "cost", "policy", "keys", "codec", "tiers", "cache", "workloads"} <= rules.core
    bad = engine_violations(rules, PACKAGE)
    assert not bad, "\n".join(bad)


# --- the checker can fail ---------------------------------------------------------------------
SYNTHETIC_DOC = """
| room | what lives there | may import |
| --- | --- | --- |
| `errors` | errors | — |
| `specs` | specs | — |
| `tiers` | tiers | `specs` |
| `cache` | cache | `tiers` |
| `cli` | the command | every room above |

`errors` may be imported by every room.

| module | may import |
| --- | --- |
| `tiers.ledger` | `specs`, `errors` |

Core rooms (no torch at module top level): `errors`, `specs`, `tiers`, `cache`.

## Known exceptions

{exceptions}
"""

SYNTHETIC_FILES = {
    "errors.py": "",
    "specs/__init__.py": "import kvtier.errors\n\ndef late():\n    from kvtier.cache import x\n",
    "tiers/__init__.py": "from . import base\n",
    "tiers/base.py": "from ..specs import y\nfrom kvtier import specs\n",
    "tiers/ledger.py": "from kvtier.tiers.base import Tier\nfrom kvtier.specs import z\n",
    "cache/__init__.py": "from kvtier.tiers import base\nimport torch\n",
    "cache/lazy.py": "def f():\n    import torch\n",
    "cache/typed.py": "if TYPE_CHECKING:\n    import torch\n    from kvtier.cli import App\n",
    "cli/__init__.py": "import importlib\nimportlib.import_module('kvtier.cache.lazy')\n",
}


def _synthetic(tmp_path: Path, exceptions: str = "None.") -> tuple[Rules, Path]:
    root = tmp_path / "kvtier"
    for name, body in {"__init__.py": "", **SYNTHETIC_FILES}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    return parse_rules(SYNTHETIC_DOC.format(exceptions=exceptions)), root


def test_checker_reports_a_forbidden_edge(tmp_path):
    rules, root = _synthetic(tmp_path)
    assert rules.allowed["cli"] == {"errors", "specs", "tiers", "cache"}
    bad, used = edge_violations(rules, root, scan(root))
    assert bad == [
        "cache -> cli (kvtier/cache/typed.py:3)",  # under TYPE_CHECKING too
        "specs -> cache (kvtier/specs/__init__.py:4)",  # inside a function too
    ]
    assert not used
    assert not doc_violations(rules, root)


def test_checker_resolves_relative_dynamic_and_entry_imports(tmp_path):
    _, root = _synthetic(tmp_path)
    modules = {f: [i.module for i in read_imports(root, root / f)] for f in SYNTHETIC_FILES}
    assert modules["tiers/__init__.py"] == ["kvtier.tiers.base"]
    assert modules["tiers/base.py"] == ["kvtier.specs"] * 2  # `..specs`, `kvtier import specs`
    assert modules["cli/__init__.py"] == ["kvtier.cache.lazy"]
    (root / "tiers" / "registry.py").write_text('REGISTRY = {"x": "kvtier.cache.lazy:Thing"}\n')
    assert [i.module for i in read_imports(root, root / "tiers" / "registry.py")] == [
        "kvtier.cache.lazy"
    ]


def test_checker_allows_exactly_the_listed_exceptions(tmp_path):
    line = "- `specs -> cache` in `kvtier/specs/__init__.py`: being moved"
    rules, root = _synthetic(tmp_path, line)
    bad, used = edge_violations(rules, root, scan(root))
    assert bad == ["cache -> cli (kvtier/cache/typed.py:3)"]  # not listed: still reported
    assert used == {("specs", "cache", "kvtier/specs/__init__.py")}


def test_checker_reports_the_narrow_rule_and_engine_imports(tmp_path):
    rules, root = _synthetic(tmp_path)
    bad, _ = narrow_violations(rules, root, scan(root))
    assert bad == [
        "tiers.ledger -> tiers.base (kvtier/tiers/ledger.py:1): only ['errors', 'specs']"
    ]
    assert engine_violations(rules, root) == [
        "cache imports torch at module top level (kvtier/cache/__init__.py:2)"
    ]


def test_checker_reads_the_doc_strictly(tmp_path):
    rules, root = _synthetic(tmp_path)
    (root / "sim").mkdir()
    (root / "sim" / "__init__.py").write_text("")
    assert doc_violations(rules, root) == ["sim exists under kvtier/ but is not in the table"]
    with pytest.raises(ValueError, match="cannot read"):
        parse_rules(SYNTHETIC_DOC.replace("every room above", "most rooms"))


def test_checker_reports_import_circles_lazy_ones_too(tmp_path):
    _, root = _synthetic(tmp_path)
    # specs -> cache (inside a function) -> tiers.base -> specs
    assert import_cycles(root, scan(root)) == [
        "kvtier.cache -> kvtier.tiers.base -> kvtier.specs -> kvtier.cache"
    ]
    (root / "specs" / "__init__.py").write_text("import kvtier.errors\n")
    assert import_cycles(root, scan(root)) == []


def test_checker_keeps_the_product_from_the_instruments(tmp_path):
    _, root = _synthetic(tmp_path)
    doc = SYNTHETIC_DOC.format(exceptions="None.")
    served = parse_rules(doc + "\nProduct rooms (served): `errors`, `specs`, `tiers`, `cache`.\n")
    assert served.product == {"errors", "specs", "tiers", "cache"}
    assert not doc_violations(served, root)
    leaky = parse_rules(doc + "\nProduct rooms (served): `errors`, `specs`, `cache`.\n")
    assert doc_violations(leaky, root) == ["product room cache may import tiers, an instrument"]
