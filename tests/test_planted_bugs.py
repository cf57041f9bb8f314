"""The harness must catch every planted bug on the quick profile, and pass the control."""
import pytest

from harness.judging.cases import catalogue
from harness.judging.runner import CheckResult, OracleCache, check
from tests.planted import PLANTED, Correct


def _error_in(*outputs):
    return lambda r: any(not e.ok and e.output in outputs for e in r.errors)


def _guard(kind, output="y"):
    return lambda r: any(f.kind == kind and f.output == output for f in r.findings)


def _nan_leak(r: CheckResult):
    return r.case.dist == "nan_row" and any(not e.ok for e in r.errors)


# bug -> (ops it applies to, what the harness must report)
EXPECTED = {
    "eps_outside_sqrt": (("rms_norm", "layer_norm"), _error_in("y", "rstd")),
    "divides_by_padded_n": (("rms_norm", "layer_norm"), _error_in("y", "mean", "rstd")),
    "one_pass_variance": (("layer_norm",), _error_in("y", "rstd")),
    "skips_tail_rows": (("rms_norm", "layer_norm"), _guard("unwritten")),
    "writes_past_row_end": (("rms_norm", "layer_norm"), _guard("out-of-bounds write")),
    "rstd_as_std": (("rms_norm", "layer_norm"), _error_in("rstd")),
    "ignores_weight": (("rms_norm", "layer_norm"), _error_in("y")),
    "ignores_bias": (("layer_norm",), _error_in("y")),
    "accumulates_in_bf16": (("rms_norm", "layer_norm"), _error_in("y", "rstd")),
    "leaks_nan_across_rows": (("rms_norm", "layer_norm"), _nan_leak),
    "modifies_input": (("rms_norm", "layer_norm"), _guard("input modified", "x")),
    "shifts_by_first_element": (("layer_norm",), lambda r: r.case.dist == "outlier_first"
                                and _error_in("y", "mean", "rstd")(r)),
    "clamp_drops_nan": (("rms_norm", "layer_norm"), _nan_leak),
}
PAIRS = [(bug, op) for bug, (ops, _) in EXPECTED.items() for op in ops]


def test_every_planted_bug_has_an_expectation():
    assert set(EXPECTED) == set(PLANTED)


@pytest.mark.parametrize("bug,op", PAIRS, ids=[f"{b}-{o}" for b, o in PAIRS])
def test_planted_bug_is_caught(bug, op):
    kernel = PLANTED[bug](op)
    expected = EXPECTED[bug][1]
    oracle = OracleCache()
    other_failures = []
    for case in (c for c in catalogue("quick") if c.op == op):
        result = check(kernel, case, oracle=oracle)
        assert result.skipped is None, result.skipped
        if not result.ok:
            if expected(result):
                return
            other_failures.append(result.failure_message())
    pytest.fail(f"{kernel.name} ({op}) was not caught as expected; other failures: {other_failures[:3]}")


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_control_passes_every_case(op):
    """The bug-free float32 kernel the planted ones derive from passes the whole quick profile,
    so each catch above is the bug's doing."""
    kernel = Correct(op)
    oracle = OracleCache()
    failures = [r.failure_message() for c in catalogue("quick") if c.op == op
                for r in [check(kernel, c, oracle=oracle)] if not r.ok]
    assert not failures, "\n".join(failures[:5])


def test_only_outlier_first_rows_catch_a_shift_by_the_first_element():
    """The shift by x[row, 0] passes every other case, large-mean rows included (the shift is
    there for them): the outlier_first rows are what the catalogue needs to catch it."""
    kernel = PLANTED["shifts_by_first_element"]("layer_norm")
    oracle = OracleCache()
    failed = {c.dist for c in catalogue("quick") if c.op == "layer_norm"
              for r in [check(kernel, c, oracle=oracle)] if not r.ok}
    assert failed == {"outlier_first"}
