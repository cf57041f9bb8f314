"""harness/ by responsibility (docs/ARCHITECTURE.md, *Packages*): which package may import which,
read from every import in the source (those inside functions too), so it holds for code added later.

  judging     the checks' judging: cases, inputs, comparison, guards, one check, properties
  report      the reports: reads documents; imports judging's shapes (the targets), nothing that runs
  running     running the checks: workers, isolation, memory, the ledger, the run's state and records
  benchmarks  the benchmarks' parts
  repro       standalone reproductions of failures (python -m harness.repro)
  (top level) the entry points: the pytest plugins, the checks (test_*.py), the python -m commands

A package imports only packages at or before it in that order; no package imports the top level.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"
ORDER = ("judging", "report", "running", "benchmarks", "repro")
ENTRY_POINTS = {"plugin", "bench", "entry", "doctor", "bench_gpus", "warm", "measure", "families"}  # with test_*.py


def harness_imports(source: str) -> set[str]:
    """Every harness module or package a source imports, as a dotted name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "harness"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def layer(dotted: str) -> str | None:
    """The package of a harness module ("top" for an entry point), or None when the name is not a module."""
    parts = dotted.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in ORDER:
        return parts[1]
    if parts[1] in ENTRY_POINTS or parts[1].startswith("test_"):
        return "top"
    return None


def violations(rel: str, imports: set[str]) -> list[str]:
    mine = rel.split("/")[1] if rel.count("/") >= 2 else "top"
    if mine == "top":
        return []
    bad = []
    for name in sorted(imports):
        other = layer(name)
        if other == "top":
            bad.append(f"{rel} imports the entry point {name}")
        elif other is not None and ORDER.index(other) > ORDER.index(mine):
            bad.append(f"{rel} ({mine}) imports {name} ({other}), which comes after it")
    return bad


def test_every_module_is_in_a_package_or_an_entry_point():
    loose = [p.name for p in HARNESS.glob("*.py") if p.stem not in ENTRY_POINTS | {"__init__"}
             and not p.stem.startswith("test_")]
    assert not loose, f"modules at harness/'s top level that are neither entry points nor checks: {loose}"
    assert {p.name for p in HARNESS.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(ORDER)


def test_packages_import_only_those_before_them():
    bad = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        bad += violations(rel, harness_imports(path.read_text()))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("rel, source, expected", [
    ("harness/judging/cases.py", "from harness.running import memory", "imports harness.running"),
    ("harness/report/x.py", "def f():\n    from harness.running.memory import fmt", "imports harness.running.memory"),
    ("harness/running/x.py", "import harness.plugin", "entry point harness.plugin"),
    ("harness/benchmarks/x.py", "from harness.running import ledger\nfrom harness.judging import cases", None),
])
def test_the_rule_can_fail(rel, source, expected):
    found = violations(rel, harness_imports(source))
    assert (expected is None and not found) or (expected and any(expected in f for f in found)), found


# -- no import cycles in harness/ and impls/ ------------------------------------------------------
# A module's imports, read from the source: every import at any level (inside functions too),
# relative ones resolved; ``from x import y`` imports the module x.y where y is one, else x.
GRAPH_ROOTS = ("harness", "impls")


def module_index(root: Path = ROOT, tops: tuple[str, ...] = GRAPH_ROOTS) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's __init__)."""
    index = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            package = parts[-1] == "__init__"
            index[".".join(parts[:-1] if package else parts)] = (path, package)
    return index


def imported_modules(name: str, source: str, package: bool, known) -> set[str]:
    """The modules among ``known`` that module ``name`` imports (itself left out)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if package else name.split(".")[:-1]
                here = here[:len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found |= {sub} if sub in known else ({base} if base in known else set())
    return found - {name}


def import_graph(root: Path = ROOT, tops: tuple[str, ...] = GRAPH_ROOTS) -> dict[str, set[str]]:
    index = module_index(root, tops)
    return {name: imported_modules(name, path.read_text(), package, index) for name, (path, package) in index.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan's algorithm), as one
    cycle through its first module: [a, b, ..., a]."""
    order, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return [_cycle_through(graph, c) for c in components]


def _cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, inside the component."""
    start = min(component)
    came = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(graph[v] & component):
            if w == start:
                path = [v]
                while came[path[-1]] is not None:
                    path.append(came[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
            if w not in came:
                came[w] = v
                queue.append(w)
    return sorted(component)


def test_harness_and_impls_have_no_import_cycle():
    """A shared piece lives in the module it belongs to; a cycle closed by a late or local import
    still counts."""
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_impls_imports_nothing_of_the_harness():
    """The kernels and their contract stand alone: what a declaration needs of a case, the harness
    hands it (NormKernel.known_issue)."""
    bad = [f"{name} imports {other}" for name, imported in import_graph(ROOT, GRAPH_ROOTS).items()
           if name.split(".")[0] == "impls" for other in sorted(imported) if other.split(".")[0] == "harness"]
    assert not bad, "\n".join(bad)


def test_the_cycle_finder_can_fail():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a", "f"}, "f": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    known = {"p", "p.m", "p.n", "p.q", "p.q.r"}
    source = "from . import n\nfrom .q import r\ndef f():\n    from p.m import name\n    import p.q\n"
    assert imported_modules("p.m", source, False, known) == {"p.n", "p.q.r", "p.q"}  # itself left out
    assert imported_modules("p.q", "from .. import m\nfrom . import r", True, known) == {"p.m", "p.q.r"}
    assert imported_modules("p.n", "from p import thing", False, known) == {"p"}
