"""The backward check inside the harness as a run uses it (xdist workers, the report): a kernel
without a backward is skipped with the reason, a wrong dw fails with its error table and a
command that reproduces it, two backward kernels on one case land in a backward agreement table,
and the backward's determinism is recorded."""
import json
import os
import shlex
import subprocess
import sys
import textwrap

from tests.test_outside_backends import ROOT, run_harness

PLUGIN = textwrap.dedent('''
    from impls.registry import register
    from tests.planted import Correct, CorrectBackward, DwDropsLastPartialBlock
    for op in ("rms_norm", "layer_norm"):
        register(CorrectBackward(op))
    register(DwDropsLastPartialBlock("rms_norm"))
    register(Correct("layer_norm"))  # no backward
''')


def test_backward_results_reach_the_report(tmp_path):
    plugin = tmp_path / "planted_backward.py"
    plugin.write_text(PLUGIN)
    proc = run_harness("--backend-file", str(plugin), "--backend", "planted", "--dtype", "float32", "--profile", "quick",
                       "--report-dir", str(tmp_path), "-k", "backward",
                       test=ROOT / "harness" / "test_backward.py")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "correctness.json").read_text())
    recs = [r for r in doc["records"] if r["test"] == "test_backward"]
    assert any(r.get("worker") for r in recs)  # ran in xdist workers
    no_bwd = [r for r in recs if r["kernel"] == "planted.correct"]
    assert no_bwd and all(r["outcome"] == "skipped" and r["reason"] == "planted.correct has no backward" for r in no_bwd)
    assert all(r["outcome"] == "passed" for r in recs if r["kernel"] == "planted.correct_backward")
    dropped = [r for r in recs if r["kernel"] == "planted.dw_drops_last_partial_block"]
    failed = [r for r in dropped if r["outcome"] == "failed"]
    assert failed and all({e["output"] for e in r["errors"] if e["mismatched"]} == {"dw"} for r in failed)
    cells = {(a["op"], a["a"], a["b"]): a for a in doc["agreement"]}
    pair = cells[("rms_norm backward", "planted.correct_backward", "planted.dw_drops_last_partial_block")]
    assert pair["max_diff"] > 1 and "(dw)" in pair["worst_case"]
    det = [r for r in doc["records"] if r["test"] == "test_backward_deterministic" and r["outcome"] == "passed"]
    assert det and all(r["deterministic"] for r in det)
    md = (tmp_path / "correctness.md").read_text()
    assert "**rms_norm backward, float32**" in md and "planted.correct (backward)" not in md
    assert failed[0]["nodeid"].split("::")[-1] in md
    # The report's command reproduces the failure on its own.
    from harness.report import repro_command

    cmd = shlex.split(repro_command(doc, failed[0]))
    prefix = dict(w.split("=", 1) for w in cmd[:cmd.index("pytest")])  # the run's environment
    cmd = cmd[len(prefix):]
    assert cmd[:2] == ["pytest", failed[0]["nodeid"]] and str(plugin) in cmd
    again = subprocess.run([sys.executable, "-m", *cmd, "-n", "0", "--no-report"], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, **prefix, "PYTHONPATH": str(ROOT)})
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout[-2000:]
