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
ENTRY_POINTS = {"plugin", "bench", "entry", "doctor", "bench_gpus", "warm", "measure"}  # with test_*.py


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
