"""A kernel author's first hour, after the plug-in runs (issue 52, parts 4-6), as they would meet it:
``pytest harness`` in a subprocess on their own plug-in file outside the repository, a buggy
RMSNorm whose mean divides by the next power of two above N (right at every power of two, wrong
everywhere else), and a correct twin.

- the report shows the pattern on its first screen: a pass/fail grid by N and dtype, the rule the
  failing N follow, then the first failure with its size and reproduction, before the determinism
  section; every column of the errors' table is explained;
- the terminal gives each failing check one line (what failed, by how much), no tracebacks
  unless asked (-v), and the report's path is the run's last line, with xdist workers too;
- ``python -m harness.report --compare A B`` counts outcomes, lists each check once and exits
  non-zero when a check that passed in A fails in B.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.report.failure import ERROR_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = textwrap.dedent('''
    import os

    import torch

    from impls.base import NormKernel
    from impls.registry import register


    @register
    class MyRMSNorm(NormKernel):
        op, backend, variant, outputs = "rms_norm", "firsthour", "rows", ("y", "rstd")

        def _forward(self, x, weight, bias, eps, out):
            xf = x.float()
            n = x.shape[-1]
            # the planted bug: the block's size, the next power of two, where N belongs
            divide = 1 << max(n - 1, 0).bit_length() if os.environ.get("FIRST_HOUR_BUG") else n
            rstd = torch.rsqrt(xf.pow(2).sum(-1) / divide + eps)
            y = xf * rstd[:, None]
            out.y.copy_(y if weight is None else y * weight.float())
            out.rstd.copy_(rstd)
''')


def _run(args: list[str], bug: bool = False) -> subprocess.CompletedProcess:
    drop = ("TRITON_INTERPRET", "PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "FIRST_HOUR_BUG")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if bug:
        env["FIRST_HOUR_BUG"] = "1"
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The buggy plug-in's run as a user starts it (xdist workers, the default), its first
    failing check again with -v in one process, and the correct twin's run; each with its report
    folder."""
    tmp = tmp_path_factory.mktemp("first_hour")
    plugin = tmp / "plug" / "my_rms.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN)
    base = ["-m", "pytest", "harness", "--backend-file", str(plugin), "--backend", "firsthour", "--op", "rms_norm",
            "--dtype", "float32", "--profile", "quick"]
    out = {}
    for name, extra, bug in (("bug", [], True), ("verbose", ["-n", "0", "-v", "-k", "oracle and 3x7-"], True), ("clean", ["-n", "0"], False)):
        proc = _run([*base, *extra, "--report-dir", str(tmp / name)], bug=bug)
        assert proc.returncode == (1 if bug else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
        out[name] = (proc, tmp / name)
    return out


def _records(folder: Path) -> list[dict]:
    return json.loads((folder / "correctness.json").read_text())["records"]


def _grid(md: str, row: str) -> dict[int, str]:
    """N -> cell of the first pass/fail grid's row for ``row`` (a dtype)."""
    lines = md.split("### Where it fails")[1].splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| dtype \\ N"))
    ns = [int(c) for c in lines[head].strip("|").split("|")[1:]]
    cells = next(ln for ln in lines[head:] if ln.startswith(f"| {row} |")).strip("|").split("|")[1:]
    return dict(zip(ns, (c.strip() for c in cells)))


def test_the_report_shows_the_pattern_and_the_first_failure_on_its_first_screen(runs):
    _, folder = runs["bug"]
    md = (folder / "correctness.md").read_text()
    lines = md.splitlines()
    grid = _grid(md, "float32")
    pow2 = [n for n in grid if n & (n - 1) == 0]
    assert pow2 and len(grid) > len(pow2), grid
    for n, cell in grid.items():
        if cell != "-":
            assert ("✗" in cell) == (n not in pow2), (n, cell)
    assert "Pattern: firsthour.rows fails at every N that is not a power of two" in md
    where = lambda text: next(i for i, ln in enumerate(lines) if ln.startswith(text))  # noqa: E731
    first = where("### First failure of firsthour.rows")
    assert where("## Summary") < where("### Where it fails") < first < 60, first
    assert first < where("## Determinism") < where("## Failures")
    section = "\n".join(lines[first:where("## Determinism")])
    assert "N = " in section and "out of tolerance" in section and "x allowed" in section
    assert "--backend-file" in section and "pytest 'harness/" in section  # its reproduction
    legend = next(ln for ln in lines[first:] if ln.startswith("Columns:"))
    for column in ERROR_COLUMNS[1:-1]:
        assert f"*{column}*" in legend, column
    assert "*x allowed*: the worst element's error as a multiple of its allowed error" in legend


def test_a_failing_check_prints_one_line_and_the_report_comes_last(runs):
    proc, folder = runs["bug"]
    failed = [r for r in _records(folder) if r.get("outcome") == "failed"]
    out = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    said = [ln for ln in out if ln.startswith("FAILED ")]
    assert len(failed) > 10 and len(said) == len(failed), (len(said), len(failed))
    assert all("out of tolerance" in ln and "x allowed" in ln for ln in said), said[:3]
    for traceback in ("Traceback (most recent call last)", "AssertionError", "def test_", "test_differential.py:"):
        assert traceback not in proc.stdout, traceback
    assert len(out) < len(failed) + 30, "\n".join(out)
    assert out[-1] == f"normdiff correctness report: {folder / 'correctness.md'}", out[-3:]
    # the tracebacks went to the report
    oracle = [r for r in failed if r["test"] == "test_against_oracle"]
    assert oracle and all("AssertionError" in r["message"] and "out of tolerance" in r["message"] for r in oracle)


def test_verbose_brings_the_tracebacks_back(runs):
    proc, folder = runs["verbose"]
    assert "AssertionError" in proc.stdout and "def test_against_oracle" in proc.stdout
    out = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert out[-1] == f"normdiff correctness report: {folder / 'correctness.md'}"


def test_compare_counts_lists_each_check_once_and_gates(runs):
    (_, clean), (_, bug) = runs["clean"], runs["bug"]
    proc = _run(["-m", "harness.report", "--compare", str(clean), str(bug)])
    assert proc.returncode == 1, proc.stdout[-2000:]
    before, after = _records(clean), _records(bug)
    for outcome in ("passed", "failed", "skipped"):
        a, b = (sum(r.get("outcome") == outcome for r in rs) for rs in (before, after))
        assert f"| {outcome} | {a} | {b} |" in proc.stdout, outcome
    regressed = [r["nodeid"].split("::")[-1] for r in after if r.get("outcome") == "failed"]
    for name in regressed:
        assert proc.stdout.count(f"`{name}`") == 1, name
    new = proc.stdout.split("## New failures")[1].split("\n## ")[0]
    assert all(f"`{name}`" in new for name in regressed)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"FAILED: {len(regressed)} check(s) that passed in A fail or err in B"), last
    same = _run(["-m", "harness.report", "--compare", str(bug), str(bug)])
    assert same.returncode == 0 and same.stdout.strip().splitlines()[-1].startswith("OK:"), same.stdout[-1000:]
