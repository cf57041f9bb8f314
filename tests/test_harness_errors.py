"""A harness error is never a kernel's failure: the rule (harness.running.attribution) on exceptions, then
whole runs with a fault injected into the harness (tests/plugins/inject_fault.py) for chosen
checks, on a simulated GPU so the memory layer runs: exactly those checks are harness errors,
every other check's outcome is what it is without the fault, and the run exits non-zero."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.running.attribution import HARNESS_ERROR, harness_error, raised_in_kernel
from impls.base import NormKernel

ROOT = Path(__file__).resolve().parents[1]
# Forward and backward checks of eager RMSNorm on a few cases: about 30 checks, seconds each run.
SELECTION = ["harness/test_differential.py", "harness/test_backward.py", "--op", "rms_norm",
             "--dtype", "bfloat16", "--simulate-gpu", "8GiB"]
TORCH = ["--backend", "torch", "-k", "17x4000 or 17x1000 or 17x4097"]


# -- the rule ------------------------------------------------------------------------------------
class _Kernel(NormKernel):
    op, backend, variant, outputs = "rms_norm", "rule", "v1", ("y", "rstd")

    def _forward(self, x, weight, bias, eps, out):
        raise RuntimeError("the kernel's own error")


def _raise(fn):
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("nothing raised")


def test_the_rule_tells_the_kernels_errors_from_the_harnesss():
    kernel = _Kernel()
    inside = _raise(lambda: kernel._forward(None, None, None, 1e-6, None))
    assert raised_in_kernel(inside) and harness_error(inside, "call") is None
    outside = _raise(lambda: None > 1)  # a budget left None, compared as a harness bug would
    found = harness_error(outside, "call")
    assert found["error"].startswith("TypeError") and found["phase"] == "call" and "test_harness_errors" in found["where"]
    assert harness_error(_raise(lambda: pytest.fail("wrong y")), "call") is None  # a verdict is the kernel's
    assert harness_error(AssertionError("max ulp 3 > 1"), "call") is None
    assert harness_error(_raise(lambda: pytest.skip("no GPU")), "setup") is None
    assert harness_error(_raise(lambda: {}["x"]), "teardown")["phase"] == "teardown"

    def wrapped():  # the harness re-raising what the kernel raised: still the kernel's
        try:
            kernel._forward(None, None, None, 1e-6, None)
        except RuntimeError as exc:
            raise ValueError("while checking") from exc

    assert harness_error(_raise(wrapped), "call") is None


# -- whole runs ----------------------------------------------------------------------------------
def run(tmp_path: Path, name: str, *args: str, fault: str = "") -> tuple[int, dict]:
    env = {**os.environ, "NORMDIFF_FAULT": fault}
    cmd = [sys.executable, "-m", "pytest", *SELECTION, *args, "-p", "tests.plugins.inject_fault",
           f"--report-dir={tmp_path / name}", "-q", "-p", "no:randomly"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    path = tmp_path / name / "correctness.json"
    assert path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(path.read_text())
    return proc.returncode, {r["nodeid"]: r for r in doc["records"]}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baseline")
    code, records = run(tmp, "clean", "-n", "2", *TORCH)
    assert code == 0 and records and all(r["outcome"] in ("passed", "skipped") for r in records.values())
    return records


def _outcomes(records: dict) -> dict:
    return {n: r["outcome"] for n, r in records.items()}


def _pick(records: dict, test: str, k: int) -> list[str]:
    ids = sorted(n for n, r in records.items() if r["test"] == test and r["outcome"] == "passed")
    assert len(ids) >= k, ids
    return ids[:k]


def test_a_fault_in_admission_is_that_checks_harness_error_alone(baseline, tmp_path):
    """Two workers on one simulated card: the ledger fails for one check; it alone is a harness
    error, every other check (later ones on the same worker included) comes out as before."""
    target = _pick(baseline, "test_against_oracle", 1)[0]
    code, records = run(tmp_path, "admit", "-n", "2", *TORCH, fault=f"harness.running.ledger:GpuLedger.admit@{target.split('::')[1]}")
    assert code != 0
    assert records[target]["outcome"] == HARNESS_ERROR
    assert "injected fault at harness.running.ledger:GpuLedger.admit" in records[target]["harness_errors"][0]["error"]
    assert {n: o for n, o in _outcomes(records).items() if n != target} == \
           {n: o for n, o in _outcomes(baseline).items() if n != target}
    md = (tmp_path / "admit" / "correctness.md").read_text()
    assert "1 harness errors" in md and "### Harness errors (1): not the kernels'" in md
    assert md.index("### Harness errors") < md.index("## Closest calls")


def test_faults_in_every_phase_are_harness_errors(baseline, tmp_path):
    """One process: a fault in the worker's set-up, in drawing a case's inputs, in the oracle and
    in the memory watch's teardown, each in its own check."""
    first = next(iter(baseline))  # the first check to run sets the memory layer up
    oracle, drawn = _pick(baseline, "test_against_oracle", 3)[1:]
    teardown = _pick(baseline, "test_backward", 1)[0]
    faults = {first: "harness.running.devmem:SimulatedCard.mem_get_info", drawn: "harness.judging.inputs:make_inputs",
              oracle: "impls.reference:reference", teardown: "harness.running.memory_watch:MemoryWatch._update_held"}
    spec = ";".join(f"{where}@{nodeid.split('::')[1]}" for nodeid, where in faults.items())
    code, records = run(tmp_path, "phases", "-n", "0", *TORCH, fault=spec)
    assert code != 0
    for nodeid, where in faults.items():
        assert records[nodeid]["outcome"] == HARNESS_ERROR, (where, records[nodeid])
    assert records[teardown]["harness_errors"][0]["phase"] == "teardown"
    assert {n: o for n, o in _outcomes(records).items() if n not in faults} == \
           {n: o for n, o in _outcomes(baseline).items() if n not in faults}


def test_an_under_declared_workspace_is_retried_alone_then_out_of_memory(tmp_path):
    """A plug-in admitted on its (too small) estimate asks for more than the simulated card
    holds: it runs out of memory, runs again alone, runs out again and is counted *out of
    memory*; no other check's outcome moves (against the same run where it asks for nothing)."""
    greedy = ["--backend", "torch,greedy", "--backend-file", "tests/plugins/greedy_workspace.py", "-k", "17x769",
              "-n", "2"]
    os.environ["GREEDY_WORKSPACE"] = "0"
    try:
        code, calm = run(tmp_path, "calm", *greedy)
    finally:
        del os.environ["GREEDY_WORKSPACE"]
    assert code == 0
    code, records = run(tmp_path, "greedy", *greedy)
    oom = [n for n, r in records.items() if r["outcome"] == "out of memory"]
    assert len(oom) == 1 and "greedy" in oom[0] and "test_against_oracle" in oom[0]
    events = records[oom[0]]["oom_events"]
    assert [e["attempt"] for e in events] == ["first try", "alone"] and events[0]["asked"] == 64 << 30
    assert "over_allocation" in events[0]  # 64 GiB against an estimate of MiBs: a finding about the kernel
    assert code == 0  # out of memory is neither a failure nor a harness error
    assert {n: o for n, o in _outcomes(records).items() if n not in oom} == \
           {n: o for n, o in _outcomes(calm).items() if n not in oom}
