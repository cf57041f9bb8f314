"""The checks of a family without check files of its own (harness.judging.family.Family: a
plug-in's): every kernel of the family on every case of its catalogue against its oracle, forward
and, where it has one, backward. The project's families have their own files
(test_differential.py, test_backward.py, test_fused.py) with their own node ids."""
import pytest

from harness.judging.family import family
from harness.plugin import expect_known_issue, record


def _judge(request, result):
    if result.skipped:
        pytest.skip(result.skipped)
    record(request.node, errors=[e.to_dict() for e in result.errors], findings=[f.__dict__ for f in result.findings])
    assert result.ok, result.failure_message()


@pytest.mark.needs("oracle")
def test_family_against_oracle(family_case_kernel, harness_state, request):
    case, kernel = family_case_kernel
    expect_known_issue(request, kernel, case)
    _judge(request, family(kernel.family).check(kernel, case, watch=harness_state.watch))


@pytest.mark.needs("backward")
def test_family_backward(family_backward_case_kernel, harness_state, request):
    case, kernel = family_backward_case_kernel
    expect_known_issue(request, kernel, case)
    _judge(request, family(kernel.family).check_backward(kernel, case, watch=harness_state.watch))
