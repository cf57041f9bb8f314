"""A call leaves its inputs as it found them, flags included: a kernel that sets requires_grad on
a tensor the caller handed it (on a float32 tensor ``.float()`` is the tensor itself) fails
with an "input altered" finding naming the input and the change, in the plain and the fused
checks, forward and backward; the honest kernels pass the same cases."""
from __future__ import annotations

import pytest
import torch

from harness.judging.cases import Case
from harness.judging.fused_cases import fused_case_from_id
from harness.judging.fused_runner import FusedOracleCache, check_fused, check_fused_backward
from harness.judging.runner import BackwardOracleCache, OracleCache, check, check_backward
from impls.fused import FusedGrads
from impls.torch_fused import TorchAddRMSNorm, TorchRMSNormFused, normalize
from tests.planted import Correct, CorrectBackward

FORWARD = Case("rms_norm", "float32", (17, 64))
BACKWARD = Case("rms_norm", "float32", (17, 64), dy_dist="normal")


class SetsWeightGrad(Correct):
    """Writes every output right, then sets requires_grad on the caller's weight."""
    variant = "sets_weight_grad"

    def _forward(self, x, weight, bias, eps, out):
        super()._forward(x, weight, bias, eps, out)
        weight.requires_grad_()


class FloatLeavesBackward(CorrectBackward):
    """The backward takes autograd leaves as ``t.float().requires_grad_()``: on float32 the caller's weight."""
    variant = "float_leaves_backward"

    def _backward(self, x, weight, bias, dy, saved, eps, out):
        weight.float().requires_grad_()
        super()._backward(x, weight, bias, dy, saved, eps, out)


class FusedSetsWeightGrad(TorchAddRMSNorm):
    variant = "sets_weight_grad"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        super()._forward(x, residual, weight, bias, eps, params, out)
        weight.requires_grad_()


class FusedFloatLeaves(TorchRMSNormFused):
    """The eager fused backward as it was: leaves ``weight.float().requires_grad_()``."""
    variant = "float_leaves"

    def _backward(self, src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out: FusedGrads):
        with torch.enable_grad():
            xs, w = src.float().requires_grad_(), weight.float().requires_grad_()
            y, _, _ = normalize(self.op, xs, w, None, eps, weight_offset)
            dx, dw = torch.autograd.grad(y, [xs, w], dy.float())
        out.dx.copy_(dx)
        out.dw.copy_(dw)


def _altered(result) -> list[tuple[str, str]]:
    return [(f.output, f.detail) for f in result.findings if f.kind == "input altered"]


def test_a_forward_that_sets_requires_grad_on_the_weight_fails_and_the_next_kernel_is_unaffected():
    cache = OracleCache()
    result = check(SetsWeightGrad("rms_norm"), FORWARD, cache)
    assert not result.ok and _altered(result) == [("weight", "requires_grad False -> True")]
    assert "weight: input altered: requires_grad False -> True" in result.failure_message()
    after = check(Correct("rms_norm"), FORWARD, cache)
    assert after.ok, after.failure_message()
    assert not cache.get(FORWARD, "cpu")[0].weight.requires_grad


def test_a_backward_that_sets_requires_grad_on_the_weight_fails():
    cache = BackwardOracleCache()
    result = check_backward(FloatLeavesBackward("rms_norm"), BACKWARD, cache)
    assert not result.ok and _altered(result) == [("weight", "requires_grad False -> True")]
    assert check_backward(CorrectBackward("rms_norm"), BACKWARD, cache).ok


def test_fused_forward_that_sets_requires_grad_on_the_weight_fails():
    case, cache = fused_case_from_id("add_rms_norm-float32-3x7-normal"), FusedOracleCache()
    result = check_fused(FusedSetsWeightGrad(), case, cache)
    assert not result.ok and _altered(result) == [("weight", "requires_grad False -> True")]
    assert check_fused(TorchAddRMSNorm(), case, cache).ok


@pytest.mark.parametrize("case_id", ["rms_norm-float32-17x1000-normal-w1-dynormal",
                                     "add_rms_norm-float32-17x1000-normal-w1-dynormal"])
def test_the_eager_fused_backward_leaves_float32_inputs_alone(case_id):
    """The eager fused backward on float32: its leaves are detached copies, not the caller's tensors."""
    case = fused_case_from_id(case_id)
    kernel = TorchRMSNormFused() if case.op == "rms_norm" else TorchAddRMSNorm()
    result = check_fused_backward(kernel, case)
    assert result.ok, result.failure_message()


def test_a_fused_backward_with_float_leaves_fails_on_float32():
    case = fused_case_from_id("rms_norm-float32-17x1000-normal-w1-dynormal")
    result = check_fused_backward(FusedFloatLeaves(), case)
    assert not result.ok
    assert _altered(result) == [("weight", "requires_grad False -> True")]


def test_the_report_names_what_changed():
    from harness.report.failure import summary_line

    result = check(SetsWeightGrad("rms_norm"), FORWARD)
    line = summary_line({"findings": [f.__dict__ for f in result.findings]})
    assert line == "input altered in weight: requires_grad False -> True"
