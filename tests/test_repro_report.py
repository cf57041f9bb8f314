"""Reports point to repros: a run of the planted kernels (tests/plugins/repro_planted.py) names each
failure's standalone repro command, in its failure groups and under each failure, and
``python -m harness.report RUN/correctness.json --repros`` (``python -m harness.repro --report
RUN/correctness.json --all``) writes them into the run's folder,
each printing the report's worst error and "x allowed" to 3 significant figures."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.report import load_report
from harness.report.failure import REPRO_TESTS
from harness.repro.target import CHECKS

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "tests/plugins/repro_planted.py"


def test_the_report_names_and_writes_each_failure_s_repro(tmp_path):
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "pytest", "harness", "-n", "0", "-q", "-p", "no:cacheprovider",
                    "--backend-file", PLUGIN, "--backend", "reproplant", "--report-dir", str(run),
                    "-k", "test_against_oracle and rms_norm-bfloat16-3x1000-normal"], cwd=ROOT, capture_output=True,
                   timeout=300)
    doc = load_report(run / "correctness.json")
    failed = [r for r in doc["records"] if r.get("outcome") == "failed"]
    assert {r["kernel"] for r in failed} == {"reproplant.padded", "reproplant.lastcol"}
    md = (run / "correctness.md").read_text()
    for r in failed:
        assert f"python -m harness.repro '{r['nodeid']}' --backend-file {PLUGIN}" in md
    assert all(g.get("repro") for g in doc["failure_groups"])
    # harness.report writes them as harness.repro does
    subprocess.run([sys.executable, "-m", "harness.report", str(run / "correctness.json"), "--repros"],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    files = sorted((run / "repros").glob("*.py"))
    assert len(files) == 2 and "padded" in (run / "repros" / "README.md").read_text()
    padded = next(r for r in failed if r["kernel"] == "reproplant.padded")
    path = next(f for f in files if "padded" in f.name)
    got = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 1
    for e in padded["errors"]:
        line = next(ln for ln in got.stdout.splitlines() if ln.startswith(f"{e['output']}:"))
        assert f"{e['worst_ratio']:.3g}x the allowed error" in line and f"max abs err {e['max_abs']:.3g}" in line
    assert "The report printed:" in path.read_text()


def test_the_report_and_the_repro_know_the_same_checks():
    assert set(REPRO_TESTS) == set(CHECKS)
