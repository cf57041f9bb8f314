"""Every selected kernel against the float64 oracle, inside guards, on every catalogue case."""
import pytest

from harness.judging import runner
from harness.plugin import expect_known_issue, record


@pytest.mark.needs("oracle")
def test_against_oracle(case_kernel, harness_state, request):
    case, kernel = case_kernel
    expect_known_issue(request, kernel, case)
    result = runner.check(kernel, case, oracle=harness_state.oracle, keep_outputs=True, watch=harness_state.watch)
    if result.skipped:
        pytest.skip(result.skipped)
    record(
        request.node,
        errors=[e.to_dict() for e in result.errors],
        findings=[f.__dict__ for f in result.findings],
    )
    request.node.user_properties.append(("normdiff_agreement", harness_state.record_agreement(result)))
    assert result.ok, result.failure_message()
