"""The backward check (harness.judging.runner.check_backward) must catch every planted backward bug on
the quick backward catalogue, each in the gradient it breaks, and pass the bug-free twin."""
import pytest

from harness.judging.cases import backward_catalogue
from harness.judging.runner import BackwardOracleCache, check_backward
from tests.planted import BACKWARD_PLANTED, Correct, CorrectBackward

# bug -> (ops it applies to, the gradient the check must find wrong)
EXPECTED = {
    "dw_drops_last_partial_block": (("rms_norm", "layer_norm"), "dw"),
    "dx_missing_mean_term": (("layer_norm",), "dx"),
    "dw_accumulated_in_16_bits": (("rms_norm", "layer_norm"), "dw"),
    "dx_divides_by_padded_n": (("rms_norm", "layer_norm"), "dx"),
    "dx_dot_reads_past_row": (("rms_norm", "layer_norm"), "dx"),
    "db_scaled_by_one_over_m": (("layer_norm",), "db"),
}
PAIRS = [(bug, op) for bug, (ops, _) in EXPECTED.items() for op in ops]


class _EveryCase(BackwardOracleCache):
    """The quick backward catalogue's oracles, kept for the whole module (every test runs them)."""

    memo: dict = {}

    def get(self, case, device):
        key = (case.id, device)
        if key not in self.memo:
            self.memo[key] = BackwardOracleCache().get(case, device)
        return self.memo[key]

    def forget(self):
        self.memo.clear()


def _cases(op):
    return [c for c in backward_catalogue("quick") if c.op == op]


def test_every_planted_backward_bug_has_an_expectation():
    assert set(EXPECTED) == set(BACKWARD_PLANTED)


@pytest.mark.parametrize("bug,op", PAIRS, ids=[f"{b}-{o}" for b, o in PAIRS])
def test_planted_backward_bug_is_caught(bug, op):
    """Caught in the expected gradient on some case, and the correct twin passes that case (so
    the catch is the bug's doing); nothing else about the bug's gradients fails but what it breaks."""
    kernel, twin = BACKWARD_PLANTED[bug](op), CorrectBackward(op)
    gradient = EXPECTED[bug][1]
    oracle = _EveryCase()
    caught = []
    for case in _cases(op):
        result = check_backward(kernel, case, oracle=oracle)
        assert result.skipped is None, result.skipped
        assert not result.findings, result.failure_message()  # bugs of value, not of writing
        wrong = {e.output for e in result.errors if not e.ok}
        assert wrong <= {gradient}, result.failure_message()
        if wrong:
            assert check_backward(twin, case, oracle=oracle).ok, f"the correct twin fails {case.id} too"
            caught.append(case.id)
    assert caught, f"{kernel.name} ({op}) was not caught on any quick backward case"


def test_dropped_tail_rows_are_caught_at_every_tail_m():
    """Every quick catalogue M that leaves a partial block (M % ROWS_PER_BLOCK != 0) catches the
    dropped block, whatever the dtype (but LayerNorm at N = 1, where x^ = 0 and dw is exactly zero
    whichever rows count)."""
    from tests.planted import ROWS_PER_BLOCK

    oracle = _EveryCase()
    for op in ("rms_norm", "layer_norm"):
        kernel = BACKWARD_PLANTED["dw_drops_last_partial_block"](op)
        for case in _cases(op):
            if case.has_weight and case.rows % ROWS_PER_BLOCK and not (op == "layer_norm" and case.n == 1):
                result = check_backward(kernel, case, oracle=oracle)
                assert any(e.output == "dw" and not e.ok for e in result.errors), f"not caught on {case.id}"


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_correct_backward_passes_every_case(op):
    kernel = CorrectBackward(op)
    oracle = _EveryCase()
    failures = [r.failure_message() for c in _cases(op) for r in [check_backward(kernel, c, oracle=oracle)] if not r.ok]
    assert not failures, "\n".join(failures[:5])


def test_a_kernel_without_backward_is_skipped_with_the_reason():
    case = _cases("rms_norm")[0]
    result = check_backward(Correct("rms_norm"), case)
    assert result.skipped == "planted.correct has no backward" and not result.ok


def test_backward_determinism_sees_a_reduction_order_per_call():
    """A dw whose row order changes per call passes the oracle check, and only the bitwise
    backward determinism check (harness.judging.properties.backward_determinism) catches it."""
    from harness.judging.cases import Case
    from harness.judging.properties import backward_determinism
    from tests.planted import DwOrderPerCall

    case = Case("rms_norm", "float32", (257, 64), dy_dist="normal")
    kernel = DwOrderPerCall("rms_norm")
    assert check_backward(kernel, case).ok
    diffs = backward_determinism(kernel, case, "cpu")
    assert [d.output for d in diffs] == ["dw"] and diffs[0].max_ulps >= 1
    assert backward_determinism(CorrectBackward("rms_norm"), case, "cpu") == []


def test_backward_batch_invariance_sees_a_dx_order_by_m():
    """A dx whose row sums change order with the batch's size passes the oracle check and the
    determinism check; the backward batch-invariance check (harness.judging.properties.
    backward_batch_invariance) finds dx changing at the batch sizes on the other side of 64 rows,
    and the correct twin is invariant. Its case is the quick profile's."""
    from harness.judging.properties import backward_batch_cases, backward_batch_invariance, backward_determinism
    from tests.planted import DxOrderByM

    case = next(c for c in backward_batch_cases("quick") if c.op == "layer_norm")
    kernel = DxOrderByM("layer_norm")
    assert check_backward(kernel, case).ok and backward_determinism(kernel, case, "cpu") == []
    found = backward_batch_invariance(kernel, case, "cpu", quick=True)
    assert not found.nondeterministic and not found.invariant
    assert set(found.changes) == {s for s in found.sizes if s <= 64} and all(v == ["dx"] for v in found.changes.values())
    assert backward_batch_invariance(CorrectBackward("layer_norm"), case, "cpu", quick=True).invariant
