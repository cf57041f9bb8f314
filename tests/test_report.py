"""The report writer: counts, failures with errors and reproduction, skips apart, atomic writes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness.report as report

ROOT = Path(__file__).resolve().parents[1]


def _doc():
    err = {"output": "y", "max_abs": 0.5, "max_ulp": 64.0, "rel_l2": 0.01, "worst_ratio": 64.0, "mismatched": 3,
           "numel": 100, "worst_index": [2, 5], "worst_out": 1.5, "worst_ref": 1.0}
    ok = {**err, "max_abs": 1e-3, "max_ulp": 0.5, "worst_ratio": 0.5, "mismatched": 0}
    base = {"test": "test_against_oracle", "backend": "triton", "op": "rms_norm", "dtype": "bfloat16", "tags": []}
    records = {
        "harness/test_differential.py::test_against_oracle[rms_norm-bfloat16-3x7-normal-triton.rowwise]":
            {**base, "kernel": "triton.rowwise", "case": "rms_norm-bfloat16-3x7-normal", "outcome": "failed",
             "errors": [err], "findings": [{"output": "y", "kind": "unwritten", "count": 7, "first": [2, 0]}]},
        "harness/test_differential.py::test_against_oracle[rms_norm-bfloat16-3x9-normal-triton.rowwise]":
            {**base, "kernel": "triton.rowwise", "case": "rms_norm-bfloat16-3x9-normal", "outcome": "passed",
             "errors": [ok], "findings": []},
        "harness/test_differential.py::test_against_oracle[rms_norm-bfloat16-2x70000-normal-triton.rowwise]":
            {**base, "kernel": "triton.rowwise", "case": "rms_norm-bfloat16-2x70000-normal", "outcome": "skipped",
             "reason": "N=70000 exceeds triton.rowwise's limit of 65536"},
    }
    return report.build_document(
        records=records,
        agreement={("rms_norm", "bfloat16", "torch.eager", "triton.rowwise"): [1.5, 2, "rms_norm-bfloat16-3x9-normal"]},
        backends={"triton": ("triton 3.6.0 under the interpreter", None), "apex": ("", "apex not importable")},
        selection={"backend": "triton", "backend_file": [], "op": "all", "dtype": "all", "profile": "quick"},
        environment={"date": "2026-11-29", "torch": "2.13.0", "gpu": None},
        command="pytest harness --backend triton",
        elapsed=1.0,
    )


def test_markdown_states_counts_failures_skips_and_agreement():
    md = report.render_markdown(_doc())
    assert "**1 passed, 1 failed, 0 harness errors, 1 skipped** (3 checks)" in md
    assert "| triton.rowwise | rms_norm | test_against_oracle | 1 | 1 | 0 | 1 |" in md  # passed, failed, harness errors, skipped
    assert "N=70000 exceeds triton.rowwise's limit of 65536 | 1 |" in md  # skip reason, counted apart
    assert "**unwritten** in `y`: 7 element(s), first at [2, 0]" in md
    assert "| y | 3/100 | 0.5 | 64 | 0.01 | 64 |" in md
    assert ("pytest 'harness/test_differential.py::test_against_oracle[rms_norm-bfloat16-3x7-normal-triton.rowwise]' "
            "--backend triton --profile quick") in md
    assert "apex | unavailable: apex not importable" in md
    assert "torch.eager vs triton.rowwise: 1.5 allowed errors, worst on `rms_norm-bfloat16-3x9-normal`" in md


def test_written_atomically_and_regenerated_from_json(tmp_path, monkeypatch):
    doc = _doc()
    md_path, json_path = report.write_report(doc, tmp_path)
    first = md_path.read_text()
    # A crash while rendering leaves the previous report whole.
    monkeypatch.setattr(report, "render_markdown", lambda d: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        report.write_report({**doc, "command": "changed"}, tmp_path)
    monkeypatch.undo()
    assert md_path.read_text() == first and json.loads(json_path.read_text())["command"] == doc["command"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left
    out = tmp_path / "again.md"
    subprocess.run([sys.executable, "-m", "harness.report", str(json_path), "-o", str(out)], check=True, cwd=ROOT)
    assert out.read_text() == first


def test_compiled_only_kernels_are_listed_apart_and_never_passed():
    doc = _doc()
    entry = {"backend": "tilelang", "kernel": "tilelang.fragment", "dtype": "bfloat16", "n": 4000, "affine": "weight",
             "vec": 8, "threads": 256, "seconds": 1.2, "executed": False, "arch": "sm_90", "registers": 34,
             "smem_static": 0, "smem_dynamic": 1024, "spill_stores": 0, "spill_loads": 0, "stack": 0,
             "sass_arch": "sm_90"}
    doc["compiled"] = [entry]
    md = report.render_markdown(doc)
    assert "## tilelang on sm_90: compiled, not executed" in md
    assert "| tilelang.fragment | bfloat16 | 4000 | weight | 8 | 256 | 34 | 0 + 1024 | 0 / 0 | sm_90 | 1.2 |" in md
    assert "**1 passed, 1 failed, 0 harness errors, 1 skipped** (3 checks)" in md  # compiling counts as no check at all
    doc["compiled"] = [{**entry, "executed": True}]
    assert "## tilelang on sm_90: compiled\n" in report.render_markdown(doc)
    assert "compiled, not executed" not in report.render_markdown({**doc, "compiled": []})


def test_reports_of_side_by_side_runs_merge(tmp_path):
    """Two runs (backends split over processes) make one report: counts add up, a check in both
    is counted once, each failure's reproduce command uses its own run's selection."""
    a = _doc()
    b = report.build_document(
        records={
            "harness/test_differential.py::test_against_oracle[rms_norm-bfloat16-3x7-normal-tilelang.fragment]":
                {"test": "test_against_oracle", "backend": "tilelang", "op": "rms_norm", "dtype": "bfloat16",
                 "tags": [], "kernel": "tilelang.fragment", "case": "rms_norm-bfloat16-3x7-normal",
                 "outcome": "failed", "errors": [], "findings": [{"output": "y", "kind": "unwritten", "count": 1, "first": [0, 0]}]},
            next(iter(a["records"]))["nodeid"]: {"outcome": "passed", "kernel": "triton.rowwise"},
        },
        agreement={}, backends={"tilelang": ("tilelang 0.1.15", None)},
        selection={"backend": "tilelang", "backend_file": [], "op": "all", "dtype": "all", "profile": "full"},
        environment={"date": "2026-11-29"}, command="pytest harness --backend tilelang", elapsed=5.0,
    )
    for i, d in enumerate((a, b)):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "correctness.json").write_text(json.dumps(d))
    subprocess.run([sys.executable, "-m", "harness.report", str(tmp_path / "r0" / "correctness.json"),
                    str(tmp_path / "r1" / "correctness.json"), "--out", str(tmp_path / "merged")], check=True, cwd=ROOT)
    merged = json.loads((tmp_path / "merged" / "correctness.json").read_text())
    assert len(merged["records"]) == 4 and merged["elapsed_s"] == 5.0
    md = (tmp_path / "merged" / "correctness.md").read_text()
    assert "**1 passed, 2 failed, 0 harness errors, 1 skipped**" in md
    assert "--backend tilelang --profile full" in md and "--backend triton --profile quick" in md
    assert "tilelang 0.1.15" in md
