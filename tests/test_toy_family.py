"""The family seam is real: a third op family registered from a plug-in file (tests/plugins/
toy_family.py: row L2 normalisation, two catalogue rows, a correct kernel and a planted one, its
oracle, a benchmark row) runs through the checks, the report and the benchmarks, and nothing in
harness/ or impls/ names it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "tests/plugins/toy_family.py"


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_family_from_a_plugin_file_runs_through_checks_and_report(tmp_path):
    got = _pytest("harness", "--backend-file", PLUGIN, "--backend", "toy", "-n", "0", "-p", "no:randomly",
                  "--report-dir", str(tmp_path))
    assert got.returncode == 1, got.stdout[-3000:] + got.stderr[-3000:]
    records = json.loads((tmp_path / "correctness.json").read_text())["records"]
    outcome = {(r["kernel"], r["case"]): r["outcome"] for r in records}
    assert outcome == {("toy.eager", "l2_normalize-float32-3x100"): "passed",
                       ("toy.eager", "l2_normalize-bfloat16-5x129"): "passed",
                       ("toy.last_left_out", "l2_normalize-float32-3x100"): "failed",
                       ("toy.last_left_out", "l2_normalize-bfloat16-5x129"): "failed"}
    assert {r["family"] for r in records} == {"toy"} and {r["needs"] for r in records} == {"oracle"}
    report = (tmp_path / "correctness.md").read_text()
    assert "toy.last_left_out" in report and "l2_normalize-bfloat16-5x129" in report


def test_a_family_from_a_plugin_file_is_benchmarked(tmp_path):
    got = _pytest("--benchmark-only", "--backend-file", PLUGIN, "--backend", "toy", "-p", "no:randomly",
                  f"--report-dir={tmp_path}")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    doc = json.loads((tmp_path / "benchmark.json").read_text())
    rows = {b["extra_info"]["kernel"]: b["extra_info"] for b in doc["benchmarks"]}
    assert set(rows) == {"toy.eager", "toy.last_left_out"}
    assert all(r["family"] == "toy" and r["bytes"] == 2 * 256 * 1024 * 4 for r in rows.values())
    assert "toy.eager" in (tmp_path / "benchmark.md").read_text()


def test_nothing_in_harness_or_impls_names_the_toy_family():
    named = [str(p.relative_to(ROOT)) for d in ("harness", "impls") for p in (ROOT / d).rglob("*.py")
             if "l2_normalize" in p.read_text() or "toy" in p.read_text().lower().split()]
    assert not named, named
