"""The report writer: counts, failures with errors and reproduction, skips apart, atomic writes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness.report as report
from harness.report.outcomes import HARNESS_ERROR

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


@pytest.mark.parametrize("passing,failing,said", [
    ({1, 128, 4096}, {7, 129, 1000, 4097}, "not a power of two"),
    ({8, 64, 1000, 4000}, {7, 127, 4097}, "not a multiple of 8"),
    ({7, 127, 4096}, {4097, 12345}, "from 4097 (passes up to 4096)"),
    ({4097, 12345}, {7, 127}, "up to 127 (passes from 4097)"),
    ({7, 4096}, {127, 12345}, None),
])
def test_the_rule_the_failing_n_follow(passing, failing, said):
    from harness.report.pattern import rule

    found = rule(passing, failing)
    assert (found is None) if said is None else (said in found), found


def test_the_grid_and_the_first_failure_come_before_the_properties():
    doc = _doc()
    md = report.render_markdown(doc)
    at = [md.find(h) for h in ("## Summary", "### Where it fails", "**triton.rowwise** (rms_norm): pass/fail by N",
                               "### First failure of triton.rowwise", "Columns: *elements out of tolerance*",
                               "## Failures")]
    assert -1 not in at and at == sorted(at), at
    assert "| dtype \\ N | 7 | 9 |" in md and "| bfloat16 | **0/1 ✗** | 1/1 |" in md  # the skipped 70000 is no column
    first = md.split("### First failure")[1].split("## Failures")[0]
    assert "shape 3x7 (N = 7)" in first and "y 3/100 out of tolerance, worst 64x allowed" in first
    assert "--backend triton --profile quick" in first


def _compare_docs():
    err = lambda ratio, bad: {"output": "y", "worst_ratio": ratio, "mismatched": bad, "numel": 10}  # noqa: E731
    a = {"regressed": ("passed", [err(0.5, 0)]), "erred": ("passed", []), "was skipped": ("skipped", []),
         "fixed": ("failed", [err(9.0, 3)]), "moved": ("passed", [err(0.05, 0)]), "now skipped": ("passed", []),
         "declared": ("failed", [err(5.0, 1)]), "same": ("passed", [err(0.5, 0)])}
    b = {"regressed": ("failed", [err(40.0, 7)]), "erred": (HARNESS_ERROR, []), "was skipped": ("failed", [err(3.0, 1)]),
         "fixed": ("passed", [err(0.5, 0)]), "moved": ("passed", [err(0.5, 0)]), "now skipped": ("skipped", []),
         "declared": ("known issue", []), "same": ("passed", [err(0.6, 0)]), "new": ("failed", [err(2.0, 1)])}

    def doc(rows):
        return {"records": [{"nodeid": f"t.py::test[{n}]", "outcome": o, "errors": e, "reason": "why"}
                            for n, (o, e) in rows.items()]}
    return doc(a), doc(b)


def test_compare_lists_each_check_once_under_its_most_important_change():
    from harness.report import compare

    a, b = _compare_docs()
    checks = compare.compare_checks(a, b)
    text = compare.render("A", "B", checks, None, compare.count_outcomes(a, b))
    where = {}
    for section in text.split("\n## ")[1:]:
        for line in section.splitlines():
            if line.startswith("- `test["):
                name = line[len("- `test["):].split("]")[0]
                assert name not in where, (name, where.get(name), section.splitlines()[0])
                where[name] = section.splitlines()[0].split(" (")[0]
    assert where == {"regressed": "New failures", "erred": "New failures", "was skipped": "New failures",
                     "new": "New failures", "fixed": "Fixed", "moved": "Error moved by more than 2x",
                     "now skipped": "Skips that appeared", "declared": "Other changes of outcome"}
    assert "y 7/10 out of tolerance, worst 40x allowed" in text
    assert "| passed | 5 | 3 | -2 |" in text and f"| {HARNESS_ERROR} | 0 | 1 | +1 |" in text
    assert sorted(checks["regressions"]) == ["t.py::test[erred]", "t.py::test[regressed]"]  # not "was skipped"
    assert compare.verdict(checks)[0] == 1 and text.splitlines()[-1].startswith("FAILED: 2 check(s) that passed in A")
    again = compare.compare_checks(b, b)
    assert not any(again.values())
    assert compare.verdict(again) == (0, "OK: no check that passed in A fails or errs in B.")
