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


class _StaleRMSNorm:
    """A planted bug for the twin: an RMSNorm that reads x as its previous call on that buffer saw
    it (in the twin's sequential form, what a read before the producer's write gives: old x)."""

    def __new__(cls):
        from impls.torch_eager import TorchRMSNorm

        class Stale(TorchRMSNorm):
            backend = "stale"
            seen: dict = {}

            def _forward(self, x, weight, bias, eps, out):
                old = self.seen.get(x.data_ptr(), x).clone()
                self.seen[x.data_ptr()] = x.clone()
                super()._forward(old, weight, bias, eps, out)
        return Stale()


def _kernels():
    from impls import registry

    registry.load_all([])
    return {f"{k.name}/{k.op}": k for k in registry.kernels(["torch"], family=None)}


@pytest.mark.parametrize("name", ["eager/rms_norm", "eager/layer_norm", "fused/add_rms_norm", "fused/add_layer_norm",
                                  "fused/rms_norm"])
def test_the_twin_runs_the_check_on_every_family_and_passes_a_correct_kernel(name):
    from harness.judging.dependent_launch import check_dependent_launch

    kernel = _kernels()[f"torch.{name}"]
    result = check_dependent_launch(kernel, 3, 256, device="cpu", simulate=True)
    assert result.skipped is None and result.ok, result


def test_the_twin_runs_an_in_place_only_kernel():
    from harness.judging.dependent_launch import check_dependent_launch
    from impls import registry

    registry.load_all(["examples/triton_fused_backend.py"])
    kernel = registry.get("add_rms_norm", "myfused", family="fused")
    assert kernel.writes == ("in_place",)
    result = check_dependent_launch(kernel, 2, 256, device="cpu", simulate=True)
    assert result.skipped is None and result.ok, result


def test_the_twin_catches_a_kernel_that_reads_a_stale_x():
    from harness.judging.dependent_launch import check_dependent_launch

    result = check_dependent_launch(_StaleRMSNorm(), 3, 256, device="cpu", simulate=True)
    assert not result.ok and len(result.failures) >= 3
    assert "read x before the kernel before it wrote it" in result.failures[0]

