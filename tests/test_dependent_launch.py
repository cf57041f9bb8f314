"""The dependent-launch check (harness/test_dependent_launch.py, harness.judging.dependent_launch)
catches a kernel that launches with PDL and reads before it waits: on the CPU through its twin
(the decode launch compiled for sm_90, tools.pdl_wait_check), on a GPU through the CUDA graph."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.judging.dependent_launch import wait_before_loads

ROOT = Path(__file__).resolve().parents[1]
PLANTED = "tests/plugins/pdl_no_wait.py"


def test_wait_before_loads_reads_ptx_order():
    waits = "mov.u32 %r1, 0;\n\tgriddepcontrol.wait;\n\tld.global.v4.b32 {%r2}, [%rd1];\n"
    assert wait_before_loads(waits) is None
    assert "no griddepcontrol.wait" in wait_before_loads("\tld.global.b32 %r2, [%rd1];\n")
    late = "\t@%p1 ld.global.b32 %r2, [%rd1];\n\tgriddepcontrol.wait;\n"
    assert "before griddepcontrol.wait" in wait_before_loads(late)


def _wait_check(*args):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "tools.pdl_wait_check", "--json", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_every_project_triton_kernel_with_pdl_waits_before_its_loads():
    run = _wait_check("--backend", "triton")
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads(run.stdout)
    assert {"triton.rowwise/rms_norm", "triton.rowwise/layer_norm", "triton.fused/add_rms_norm",
            "triton.fused/add_layer_norm", "triton.fused/rms_norm", "triton.fused/layer_norm"} <= set(results)
    assert not any(results.values()), results


def test_the_cpu_twin_catches_the_planted_kernel_that_does_not_wait():
    run = _wait_check("--backend-file", PLANTED, "--backend", "nowait")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "no griddepcontrol.wait" in json.loads(run.stdout)["nowait.rowwise/rms_norm"]


def _on_a_card() -> str | None:
    from impls import pdl
    return pdl.unavailable("cuda")


@pytest.mark.skipif(_on_a_card() is not None, reason=f"needs a GPU that runs PDL: {_on_a_card()}")
def test_on_a_card_the_graph_check_catches_the_planted_kernel_and_passes_the_project_one():
    from harness.judging.dependent_launch import check_dependent_launch
    from impls import registry

    registry.load_all([PLANTED])
    planted = registry.get("rms_norm", "nowait", "rowwise")
    ours = registry.get("rms_norm", "triton", "rowwise")
    for m, n in ((1, 4096), (64, 4096)):
        assert check_dependent_launch(ours, m, n).ok
        bad = check_dependent_launch(planted, m, n)
        assert not bad.skipped and not bad.ok, bad
    assert torch.cuda.is_available()
