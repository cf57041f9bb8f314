"""Every selected kernel against the float64 oracle, inside guards, on every catalogue case."""
import pytest

from harness import runner
from harness.plugin import record


def test_against_oracle(case_kernel, harness_state, request):
    case, kernel = case_kernel
    issue = kernel.known_issue(case.id, runner.device_for(kernel))
    if issue:  # strict: the day it passes, the declaration must go
        request.applymarker(pytest.mark.xfail(reason=f"known issue: {issue}", strict=True))
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
