"""Runs are kept and compared: each run writes a folder of its own (reports/latest points to it),
``python -m harness.report --compare A B`` shows what changed, and the report's counts are
pytest's."""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.report import compare

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = textwrap.dedent('''
    import os
    import torch
    from impls.base import NormKernel
    from impls.registry import register

    @register
    class Mine(NormKernel):
        op, backend, variant, outputs = "rms_norm", "mine", "v", ("y", "rstd")

        def _forward(self, x, w, b, eps, out):
            rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
            if os.environ.get("MINE_BROKEN") and x.shape[1] == 769:  # the planted regression
                rstd = rstd * 1.01
            y = x.float() * rstd[:, None]
            out.y.copy_(y if w is None else y * w.float())
            out.rstd.copy_(rstd)
''')


def pytest_run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=600)


def test_two_runs_kept_and_compared_show_a_planted_regression(tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text(PLUGIN)
    args = ["harness/test_differential.py", "--backend", "torch,mine", "--backend-file", str(plugin),
            "--op", "rms_norm", "--dtype", "bfloat16", "--profile", "quick"]
    made = []
    try:
        first = pytest_run(*args)
        assert first.returncode == 0, first.stdout[-3000:]
        run_a = Path(re.search(r"normdiff correctness report: (\S+)", first.stdout).group(1)).parent
        made.append(run_a)
        assert run_a.parent == ROOT / "reports" / "runs" and "checks-torch+mine-rms_norm-bfloat16-quick" in run_a.name
        assert (ROOT / "reports" / "latest").resolve() == run_a.resolve()
        second = pytest_run(*args, env={"MINE_BROKEN": "1"})
        assert second.returncode == 1
        run_b = Path(re.search(r"normdiff correctness report: (\S+)", second.stdout).group(1)).parent
        made.append(run_b)
        assert run_b != run_a and (run_a / "correctness.json").is_file()  # the first run was kept
        assert (ROOT / "reports" / "latest").resolve() == run_b.resolve()
        compared = subprocess.run([sys.executable, "-m", "harness.report", "--compare", str(run_a), str(run_b)],
                                  cwd=ROOT, capture_output=True, text=True)
        assert compared.returncode == 1, compared.stderr[-2000:]  # a check that passed in A fails in B: a gate
        out = compared.stdout
        new = out.split("## New failures")[1].split("##")[0]
        assert "769-normal-mine.v" in new and "torch.eager" not in new
        assert "## Fixed (0)" in out
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


def test_report_counts_are_pytests(tmp_path):
    proc = pytest_run("harness", "--backend", "torch", "--op", "rms_norm", "--dtype", "bfloat16",
                      "--profile", "quick", f"--report-dir={tmp_path}", "-q")
    assert proc.returncode == 0, proc.stdout[-3000:]
    counts = [line for line in proc.stdout.splitlines() if line.startswith("=") or " passed" in line][-1]
    said = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed)", counts))
    md = (tmp_path / "correctness.md").read_text()
    counted = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped)", md.split("## Summary")[1][:300]))
    assert said.get("passed") == counted["passed"] and said.get("skipped", 0) == counted["skipped"]
    assert proc.stdout.splitlines()[-1].startswith("normdiff correctness report:")  # the run's last line
    assert "skipped" not in counts  # tilelang's compile checks are deselected, not skipped


def _bench_doc(scale=1.0, kernel_scale=None):
    doc = json.loads((ROOT / "tests" / "data" / "benchmark_sample.json").read_text())
    doc = copy.deepcopy(doc)
    for b in doc["benchmarks"]:
        k = b["extra_info"]["kernel"]
        b["stats"]["median"] *= (kernel_scale or {}).get(k, scale)
    return doc


def test_speed_moves_are_judged_against_the_runs_own_repeatability():
    base = _bench_doc()
    kernels = sorted({b["extra_info"]["kernel"] for b in base["benchmarks"]})
    slower = _bench_doc(kernel_scale={kernels[0]: 1.5})
    result = compare.compare_speed(base, slower)
    assert "repeatability" in result["how"]
    assert {m[0] for m in result["moved"]} == {kernels[0]}
    assert compare.compare_speed(base, _bench_doc())["moved"] == []
    for d in (base, slower):  # without repeat passes: the default threshold
        d["benchmarks"] = [b for b in d["benchmarks"] if b["extra_info"].get("repeat", 0) == 0]
    result = compare.compare_speed(base, slower)
    assert "default threshold" in result["how"] and {m[0] for m in result["moved"]} == {kernels[0]}


def test_progress_lines_are_plain_text_a_ci_log_can_read(tmp_path):
    proc = pytest_run("harness/test_differential.py", "--backend", "torch", "--op", "rms_norm", "--dtype", "bfloat16",
                      "--profile", "quick", "--progress-every", "0", "-n", "0", f"--report-dir={tmp_path}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[normdiff ")]
    assert lines and "\x1b" not in proc.stdout
    from harness.judging.cases import catalogue

    n = sum(1 for c in catalogue("quick") if c.op == "rms_norm" and c.dtype == "bfloat16")
    assert re.search(rf"\] {n}/{n} checks \| torch {n}/{n} done", lines[-1]), lines[-1]


def test_a_run_of_what_an_interrupted_run_left_completes_its_report():
    """harness.report's merge: a check the first run collected but did not reach takes the record
    of the later run that ran it; a check both ran keeps the first run's record; the counts are
    over distinct checks, so the merged report is complete when the two together ran everything."""
    from harness.report import merge_documents

    def doc(records, ran, collected, command):
        return {"command": command, "records": records, "agreement": [], "backends": {},
                "progress": {"final": True, "ran": ran, "collected": collected}}

    first = doc([{"nodeid": "a", "outcome": "passed"}, {"nodeid": "b", "outcome": "failed"}, {"nodeid": "c"}],
                2, 3, "first")
    later = doc([{"nodeid": "b", "outcome": "passed"}, {"nodeid": "c", "outcome": "skipped"}], 2, 2, "later")
    merged = merge_documents([first, later])
    outcomes = {r["nodeid"]: r["outcome"] for r in merged["records"]}
    assert outcomes == {"a": "passed", "b": "failed", "c": "skipped"}
    assert merged["progress"] == {"final": True, "ran": 3, "collected": 3}
    alone = merge_documents([first, doc([{"nodeid": "a", "outcome": "passed"}], 1, 1, "again")])
    assert alone["progress"]["ran"] == 2 and alone["progress"]["collected"] == 3  # c still not run
