"""Held-in planted bugs of kernels that write in place only (as FlashInfer's fused_add_rmsnorm):
each plug-in in tests/plugins/inplace_*.py is run as its author would run it, ``pytest harness
--backend-file ... --profile quick`` in a subprocess, and must fail on the cases its bug shows on,
named by the report: the fused catalogue gives an in-place-only kernel every edge kind (padded N,
NaN rows, eps rows), in place.

- inplace_tail: y's last N % 8 elements left as x was: fails where N % 8 != 0, nowhere else;
- inplace_nan_leak: a NaN row's statistic leaks into the next row: fails on the nan_row cases;
- inplace_const_eps: eps 1e-6 instead of the caller's: fails on the cases with another eps.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_SCREEN = 60  # lines: the summary, the pass/fail grid, the first failure's heading


def _n(case_id: str) -> int:
    return int(case_id.split("-")[2].split("x")[-1])


def _eps(case_id: str) -> float | None:
    m = re.search(r"-eps([0-9.e+-]+?)(?=-|$)", case_id)
    return float(m.group(1)) if m else None


PLANTED = {  # backend: (what each failing case id must show, what some case that passes must show)
    "inplace_tail": (lambda c: _n(c) % 8 != 0, lambda c: _n(c) % 8 == 0),
    "inplace_nan_leak": (lambda c: c.split("-")[3] == "nan_row", lambda c: c.split("-")[3] != "nan_row"),
    "inplace_const_eps": (lambda c: _eps(c) not in (None, 1e-6), lambda c: _eps(c) is None),
}


def run_plugin(backend: str, report: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "harness", "--backend-file", f"tests/plugins/{backend}.py",
               "--backend", backend, "--profile", "quick", "-n", "0", "--report-dir", str(report), "-p", "no:cacheprovider"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("backend", sorted(PLANTED))
def test_an_in_place_only_planted_bug_fails_its_cases(backend, tmp_path):
    proc = run_plugin(backend, tmp_path)
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    doc = json.loads((tmp_path / "correctness.json").read_text())
    records = [r for r in doc["records"] if r["test"] == "test_fused_against_oracle"]
    failed = sorted(r["case"] for r in records if r["outcome"] == "failed")
    passed = [r["case"] for r in records if r["outcome"] == "passed"]
    shows_bug, shows_no_bug = PLANTED[backend]
    assert failed, "no check failed"
    assert all("-inplace" in c for c in failed + passed), "every case run in place"
    assert all(shows_bug(c) for c in failed), f"failed where the bug cannot show: {failed}"
    assert any(shows_no_bug(c) for c in passed), f"nothing passed where the bug cannot show: {passed}"
    assert {r["outcome"] for r in doc["records"]} <= {"passed", "failed", "skipped"}  # no harness error

    lines = (tmp_path / "correctness.md").read_text().splitlines()[:FIRST_SCREEN]
    summary = next(ln for ln in lines if re.match(r"\*\*\d+ passed, \d+ failed", ln))
    every_failed = sum(r["outcome"] == "failed" for r in doc["records"])  # the drawn cases' checks too
    assert f"{every_failed} failed" in summary, summary
    first = next((ln for ln in lines if ln.startswith(f"### First failure of {backend}.planted")), None)
    assert first, "the first failure is not on the report's first screen:\n" + "\n".join(lines)
    case = re.search(r"test_fused_against_oracle\[(.+)-" + re.escape(backend) + r"\.planted\]", first).group(1)
    assert case in failed and shows_bug(case), first
    if backend == "inplace_tail":
        assert f"Pattern: {backend}.planted fails at every N that is not a multiple of 8" in "\n".join(lines)
