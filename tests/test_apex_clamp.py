"""apex's declared known issue: its dx raises |weight| below eps to eps in each element's term
(impls.apex.clamp_shift). Checked here on the GPU runs' own inputs, rebuilt on the CPU
(tools.cuda_draws): the rule declares the two drawn cases the GPU fuzz failed, must-fail, and no
neighbour that passes; and apex's dx emulated in float32 (tools.apex_one_row) fails exactly there."""
import pytest
import torch

from harness.judging.cases import case_from_id
from impls import apex, registry
from impls.reference import reference
from tools.apex_one_row import FAILING, NEIGHBOURS, emulate_dx, judge
from tools.cuda_draws import cuda_draws

PASSING = tuple(c for c in NEIGHBOURS if "1x129-normal-eps0.001" not in c and "eps0.1" not in c)


def shift_and_emulated(case_id):
    case = case_from_id(case_id)
    x, w, b, dy = cuda_draws(case)
    fwd = reference(case.op, x, None, None, case.eps_value)
    mean = fwd.mean.float().numpy() if case.op == "layer_norm" else None
    got = emulate_dx(case.op, x.numpy(), w.numpy(), dy.numpy(), mean, fwd.rstd.float().numpy(), case.eps_value)
    ratio = float(judge(case.op, x, w, b, dy, case.eps_value, got).split("x")[0])
    return apex.clamp_shift(case.op, x, w, b, dy, case.eps_value), ratio


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
    assert apex.clamp_shift("rms_norm", x, None, None, dy, 1e-3) == 0.0
    assert apex.clamp_shift("rms_norm", x, torch.full((8,), -1e-3), None, dy, 1e-3) == 0.0  # at eps: unchanged


def test_known_issue_needs_the_gpu_draws():
    """Where no GPU draws the inputs (or for a forward case) nothing is declared: the rule reads
    the inputs the GPU harness draws, which a CPU generator does not give."""
    kernel = registry.get("layer_norm", "apex")
    if not torch.cuda.is_available():
        assert kernel.known_issue(FAILING[0], "cuda") is None
    assert kernel.known_issue(FAILING[0], "cpu") is None
    assert kernel.known_issue(FAILING[0].rsplit("-dy", 1)[0], "cuda") is None
