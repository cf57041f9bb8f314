"""apex's declared known issue: its dx raises |weight| below eps to eps in each element's term
(impls.apex.clamp_shift). Checked here on the GPU runs' own inputs, rebuilt on the CPU
(tools.cuda_draws) and handed to the declaration as the harness hands them
(harness.judging.known_issues): the rule declares the two drawn cases the GPU fuzz failed,
must-fail, and no neighbour that passes; and apex's dx emulated in float32 (tools.apex_one_row)
fails exactly there."""
import pytest
import torch

from harness.judging.cases import case_from_id
from harness.judging.known_issues import Drawn
from impls import apex, registry
from impls.reference import reference
from tools.apex_one_row import FAILING, NEIGHBOURS, emulate_dx, judge
from tools.cuda_draws import cuda_draws

PASSING = tuple(c for c in NEIGHBOURS if "1x129-normal-eps0.001" not in c and "eps0.1" not in c)


def gpu_drawn(case) -> Drawn:
    """The case's inputs as the GPU harness hands them to apex's declaration (rebuilt on the CPU)."""
    x, w, b, dy = cuda_draws(case)
    return Drawn(registry.get(case.op, "apex"), case, x, w, b, case.eps_value, dy)


def shift_and_emulated(case_id):
    case = case_from_id(case_id)
    drawn = gpu_drawn(case)
    x, w, b, dy = drawn.x, drawn.weight, drawn.bias, drawn.dy
    fwd = reference(case.op, x, None, None, case.eps_value)
    mean = fwd.mean.float().numpy() if case.op == "layer_norm" else None
    got = emulate_dx(case.op, x.numpy(), w.numpy(), dy.numpy(), mean, fwd.rstd.float().numpy(), case.eps_value)
    ratio = float(judge(case.op, x, w, b, dy, case.eps_value, got).split("x")[0])
    return apex.clamp_shift(case.op, x, w, b, dy, case.eps_value, lambda: drawn.allowance("dx")), ratio


@pytest.mark.parametrize("case_id", FAILING)
def test_failing_cases_are_declared_and_must_fail(case_id):
    shift, ratio = shift_and_emulated(case_id)
    assert shift >= apex.CLAMP_MUST_FAIL and ratio > 1
    assert abs(ratio - shift) < 0.2 * shift  # the clamp is the whole error


@pytest.mark.parametrize("case_id", PASSING)
def test_passing_neighbours_are_not_declared(case_id):
    shift, ratio = shift_and_emulated(case_id)
    assert shift == 0.0 and ratio < 0.5


def test_no_weight_or_no_small_weight_is_no_shift():
    x, dy = torch.randn(2, 8), torch.randn(2, 8)

    def unasked():
        raise AssertionError("the allowance is asked for only where some |weight| is below eps")

    assert apex.clamp_shift("rms_norm", x, None, None, dy, 1e-3, unasked) == 0.0
    assert apex.clamp_shift("rms_norm", x, torch.full((8,), -1e-3), None, dy, 1e-3, unasked) == 0.0  # at eps


def test_known_issue_reads_the_inputs_the_harness_hands_it():
    """The declaration reads the inputs the harness draws (here the GPU run's, rebuilt on the
    CPU): the failing case is declared and must fail. Without inputs, on the CPU, or for a forward
    case, nothing is declared."""
    case = case_from_id(FAILING[0])
    kernel = registry.get(case.op, "apex")
    drawn = gpu_drawn(case)
    assert "clamp_by_magnitude" in kernel.known_issue(case, "cuda", lambda: drawn)
    assert not kernel.known_issue_may_pass(case, "cuda", lambda: drawn)
    assert kernel.known_issue(case, "cuda") is None and kernel.known_issue(case, "cpu", lambda: drawn) is None
    assert kernel.known_issue(case_from_id(FAILING[0].rsplit("-dy", 1)[0]), "cuda", lambda: drawn) is None
