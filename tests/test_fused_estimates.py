"""The fused checks' memory estimates (harness/running/estimate.py, _fused_check) hold under the
simulated card: every fused check, forward and backward, peaks within what it was estimated at."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_fused_checks_peak_within_their_estimates(tmp_path):
    args = [sys.executable, "-m", "pytest", "harness/test_fused.py", "--backend", "torch", "-n", "0", "-q",
            "-p", "no:randomly", "--simulate-gpu", "24GiB", "-k", "17x1000 or 65x769 or 2x16384",
            "--report-dir", str(tmp_path)]
    ran = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    records = json.loads((tmp_path / "correctness.json").read_text())["records"]
    measured = [r for r in records if r.get("mem_peak") is not None and r["test"] != "test_fused_bad_input"]
    assert {r["test"] for r in measured} == {"test_fused_against_oracle", "test_fused_backward"}
    over = [(r["nodeid"], r["mem_peak"], r["mem_estimate"]) for r in measured if r["mem_peak"] > r["mem_estimate"]]
    assert not over, over
