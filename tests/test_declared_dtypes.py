"""The checks judge what a kernel does, never an assumption of the harness: the valid calls a
check builds itself use a dtype the kernel declares (FlashInfer takes no float32), valid input a
kernel still refuses (UnsupportedCase) is a skip with its reason, bad input is judged as before,
and a call that fails on a case the kernel declares a known issue on is that issue in every check
running it (determinism and batch invariance, forward and backward), with a plug-in of kernels
that declare 16-bit dtypes only (tests/plugins/sixteen_bit_only.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "plugins" / "sixteen_bit_only.py"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("halfonly")
    argv = [sys.executable, "-m", "pytest", "harness/test_bad_input.py", "harness/test_properties.py",
            "harness/test_backward.py", "-q", "-p", "no:randomly", "-n", "0", "--backend-file", str(PLUGIN),
            "--backend", "halfonly", "--profile", "quick", "-k", "not test_backward[", "--report-dir", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads((out / "correctness.json").read_text())["records"]


def _of(records, test, kernel, op=None):
    return [r for r in records if r["test"] == test and r["kernel"] == kernel and (op is None or r["op"] == op)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the plug-in's kernels run on the CPU only")
def test_valid_calls_use_a_declared_dtype(records):
    """The edge inputs and the warm-up before each bad call run in a declared dtype (float16 for
    RMSNorm, bfloat16 for LayerNorm): every check of the plain kernel passes, warm ones included."""
    assert not [r for r in records if r["outcome"] not in ("passed", "skipped", "known issue")], \
        [(r["nodeid"], r.get("message", "")[:300]) for r in records if r["outcome"] == "failed"]
    for test in ("test_empty_batch_returns_empty_outputs", "test_output_shapes_follow_input"):
        assert [r["outcome"] for r in _of(records, test, "halfonly.default")] == ["passed", "passed"]
    bad = _of(records, "test_rejects_bad_input", "halfonly.default")
    warm = [r for r in bad if r["nodeid"].endswith("-warm]")]
    assert len(warm) >= 20 and {r["outcome"] for r in bad} == {"passed"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the plug-in's kernels run on the CPU only")
def test_valid_input_the_kernel_refuses_is_a_skip_with_its_reason(records):
    """halfonly.refuses raises UnsupportedCase on every call: the edge checks and the warm bad-input
    checks skip with its reason; the cold ones still judge its refusal of bad input."""
    for test in ("test_empty_batch_returns_empty_outputs", "test_output_shapes_follow_input"):
        (r,) = _of(records, test, "halfonly.refuses")
        if test == "test_empty_batch_returns_empty_outputs":
            assert r["outcome"] == "passed"  # no rows: nothing reaches the kernel
        else:
            assert r["outcome"] == "skipped" and "refused the valid float16 call (2, 3, 64)" in r["reason"]
            assert "has no kernel for rows of 64 here" in r["reason"]
    bad = _of(records, "test_rejects_bad_input", "halfonly.refuses")
    assert {r["outcome"] for r in bad if r["nodeid"].endswith("-cold]")} == {"passed"}
    assert {r["outcome"] for r in bad if r["nodeid"].endswith("-warm]")} == {"skipped"}
    # The property checks: each of its cases is valid input it refuses.
    props = _of(records, "test_deterministic", "halfonly.refuses") + _of(records, "test_backward_deterministic",
                                                                         "halfonly.refuses")
    assert {r["outcome"] for r in props} == {"skipped"}
    refused = [r for r in props if "has no kernel for rows" in r["reason"]]
    assert len(refused) >= 10 and all(r["reason"].startswith("halfonly.refuses cannot run ") for r in refused)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the plug-in's kernels run on the CPU only")
def test_a_declared_known_issue_is_that_issue_in_every_property_check(records):
    """halfonly.oddfails fails on 16-bit rows of odd N, declared: the forward's and the backward's
    determinism checks count those cases as the known issue; even N and float32 (not declared,
    refused by its dtypes) are judged or skipped as any."""
    for test in ("test_deterministic", "test_backward_deterministic"):
        rs = _of(records, test, "halfonly.oddfails")
        odd = [r for r in rs if r["dtype"] != "float32" and int(r["case"].split("-")[2].split("x")[-1]) % 2]
        assert odd and all(r["outcome"] == "known issue" and "cannot build 16-bit rows of odd N" in r["reason"]
                           and "RuntimeError: cp_size 16 refused" in r["reason"] for r in odd), test
        assert any(r["outcome"] == "passed" for r in rs if r not in odd) or test == "test_backward_deterministic"
