"""Committed reports: ``python -m harness.report --publish RUN DEST`` keeps a run's markdown and
plots and its JSON slimmed and gzipped, rendering the same markdown; ``reports/<device>/`` stays
small; the evidence the docs cite as path@commit is in git."""
import copy
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report import compare, load_report, publish
from tests.test_report import _doc as correctness_doc
from tests.test_runs import PLUGIN

ROOT = Path(__file__).resolve().parents[1]
DEVICE_LIMIT = 3_000_000  # bytes per reports/<device>/ folder
PLAIN_JSON_LIMIT = 200_000  # bytes: a larger JSON goes in gzipped, slimmed (--publish)


def _bench_doc() -> dict:
    return json.loads((ROOT / "tests" / "data" / "benchmark_sample.json").read_text())


def test_slimmed_documents_render_and_compare_as_the_full_ones():
    full = correctness_doc()
    full["compiled"] = [{"backend": "tilelang", "kernel": "tilelang.fragment", "dtype": "bfloat16", "n": 4000,
                         "arch": "sm_90", "registers": 34, "executed": False}]
    small = publish.slim_correctness(copy.deepcopy(full))
    assert publish.correctness_markdown(small) == publish.correctness_markdown(full)
    assert not any(compare.compare_checks(full, small).values())
    passed = next(r for r in small["records"] if r["outcome"] == "passed")
    failed = next(r for r in small["records"] if r["outcome"] == "failed")
    assert set(passed["errors"][0]) == {"output", "worst_ratio", "max_ulp"} and "tags" not in passed
    assert failed["errors"] == next(r for r in full["records"] if r["outcome"] == "failed")["errors"]

    bench = _bench_doc()
    for b in bench["benchmarks"]:
        b["stats"]["data"] = [b["stats"]["median"]] * 40  # pytest-benchmark's per-round times
    slim = publish.slim_benchmark(copy.deepcopy(bench))
    assert publish.benchmark_markdown(slim) == publish.benchmark_markdown(bench)
    assert compare.compare_speed(bench, slim)["moved"] == []
    assert all(set(b["stats"]) <= {"median", "rounds"} for b in slim["benchmarks"] if "stats" in b)
    assert len(publish.gzip_json(slim)) < len(json.dumps(bench)) / 4


def _pytest(*args, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-n", "0", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_publish_a_run(tmp_path):
    """A checks run with a planted failure and a benchmark run in one folder, published: the same
    markdown, and rendered again from the gzipped JSON, the same markdown again."""
    run, dest = tmp_path / "run", tmp_path / "h200"
    (tmp_path / "mine.py").write_text(PLUGIN)
    checks = _pytest("harness/test_differential.py", "--backend", "torch,mine", f"--backend-file={tmp_path / 'mine.py'}",
                     "--op", "rms_norm", "--dtype", "bfloat16", "--profile", "quick", "-k", "769",
                     f"--report-dir={run}", env={"MINE_BROKEN": "1"})
    counts = [line for line in checks.stdout.splitlines() if " passed" in line or " failed" in line][-1]
    assert checks.returncode == 1 and "failed" in counts, checks.stdout[-3000:]
    bench = _pytest("benchmarks", "--benchmark-only", "--backend", "torch", "--op", "rms_norm", "--dtype", "float32",
                    "--profile", "quick", "-k", "512x1024", "-m", "not fused", f"--report-dir={run}")
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    (dest / "setup").mkdir(parents=True)
    (dest / "correctness.json").write_text("{}")  # an older plain JSON: replaced
    (dest / "setup" / "doctor.txt").write_text("kept")

    subprocess.run([sys.executable, "-m", "harness.report", "--publish", str(run), str(dest)], cwd=ROOT, check=True,
                   capture_output=True)
    names = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert names == ["benchmark-rms_norm-float32.png", "benchmark.json.gz", "benchmark.md", "correctness.json.gz",
                     "correctness.md", "setup/doctor.txt"]
    for name in ("correctness.md", "benchmark.md", "benchmark-rms_norm-float32.png"):
        assert (dest / name).read_bytes() == (run / name).read_bytes()
    # The markdown rendered from the slimmed JSON is the run's.
    md = (run / "correctness.md").read_text()
    assert "769-normal-mine.v" in md.split("## Failures")[1]
    assert publish.correctness_markdown(load_report(dest / "correctness.json")) == md
    assert publish.benchmark_markdown(load_report(dest / "benchmark.json.gz")) == (run / "benchmark.md").read_text()
    subprocess.run([sys.executable, "-m", "harness.report", str(dest / "correctness.json.gz"), "-o",
                    str(tmp_path / "again.md")], cwd=ROOT, check=True)
    assert (tmp_path / "again.md").read_text() == md
    out = subprocess.run([sys.executable, "-m", "harness.report", "--compare", str(run), str(dest)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "## New failures (0)" in out and "## Fixed (0)" in out and "(0 of " in out.split("## Speed")[1]
    # Publishing a published folder in place changes nothing, byte for byte.
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    publish.publish(dest, dest)
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before


def _device_folders():
    return [d for d in sorted((ROOT / "reports").iterdir()) if d.is_dir() and not d.is_symlink() and d.name != "runs"]


def test_device_folders_stay_small():
    folders = _device_folders()
    assert folders, "no reports/<device>/ folder"
    for d in folders:
        files = [p for p in d.rglob("*") if p.is_file()]
        total = sum(p.stat().st_size for p in files)
        assert total <= DEVICE_LIMIT, f"{d.name}: {total} bytes; publish runs with python -m harness.report --publish"
        big = [str(p.relative_to(d)) for p in files if p.suffix == ".json" and p.stat().st_size > PLAIN_JSON_LIMIT]
        assert not big, f"{d.name}: plain JSON over {PLAIN_JSON_LIMIT} bytes: {big} (publish them gzipped)"


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _needs_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")


def test_local_runs_are_not_committed():
    _needs_git()
    local = ["reports/runs/x/correctness.json", "reports/latest"]
    assert _git("check-ignore", "--no-index", *local).stdout.split() == local
    assert _git("ls-files", "reports/runs", "reports/latest").stdout == ""  # ignored, and not tracked either


CITED = re.compile(r"`(reports/[^`@\s]+)@([0-9a-f]{7,40})`")


def test_cited_evidence_is_in_git():
    """Every `reports/...@commit` the docs cite exists at that commit (a folder, a file or a glob)."""
    _needs_git()
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "reports").glob("*/README.md"))]
    cited = {m.groups() for doc in docs for m in CITED.finditer(doc.read_text())}
    assert cited
    missing = []
    for path, commit in sorted(cited):
        if "*" in path:
            listed = _git("ls-tree", "--name-only", f"{commit}:{os.path.dirname(path)}").stdout.split()
            ok = bool(fnmatch.filter(listed, os.path.basename(path)))
        else:
            ok = _git("cat-file", "-e", f"{commit}:{path.rstrip('/')}").returncode == 0
        if not ok:
            missing.append(f"{path}@{commit}")
    if missing and _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip(f"a shallow clone lacks the history of {len(missing)} cited paths")
    assert not missing, f"cited but not in git: {missing}"
