"""Cases the catalogue does not list: hypothesis draws shapes, layouts, distributions, eps and
affine parameters, and every selected kernel must match the oracle inside guards on each; its
backward too (test_fuzz_backward: dy's distribution drawn as well), where it has one.
A failure prints the drawn Case; its id rebuilds the same inputs (harness.judging.cases.case_from_id)."""
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

from harness.judging import fused_runner, known_issues, runner
from harness.plugin import record
from harness.judging.cases import AFFINE, DTYPES, Case
from harness.judging.fused_cases import FP8, HUGE_SCALE, TINY_SCALE, FusedCase, accepted_writes
from impls.fused import ADD_OPS, BASE_OP

# Distributions a drawn case may use (NaN rows stay in the catalogue: one NaN row per case).
DISTS = ("normal", "offset", "large_mean", "constant", "outlier_first", "tiny", "huge")


DY_DISTS = ("normal", "outliers", "zeros")


@st.composite
def cases(draw, op: str, max_elems: int, backward: bool = False, max_rows: int = 300, dists: tuple = DISTS):
    n = draw(st.one_of(st.integers(1, 5000), st.integers(5000, 70000)))
    m = draw(st.integers(1, max(1, min(max_rows, max_elems // n))))
    shape = (m, n) if draw(st.booleans()) else (*draw(st.sampled_from([(1, m), (m, 1)])), n)
    return Case(
        op=op,
        dtype=draw(st.sampled_from(tuple(DTYPES))),
        shape=shape,
        dist=draw(st.sampled_from(dists)),
        eps=draw(st.sampled_from([None, 1e-6, 1e-3, 0.1])),
        affine=draw(st.sampled_from([a for a in AFFINE if op == "layer_norm" or a != "bias"])),
        row_pad=draw(st.sampled_from([0, 0, 1, 3, 64])),
        dy_dist=draw(st.sampled_from(DY_DISTS)) if backward else None,
        tags=("fuzz",),
    )


# The fused draws: fp8 scales (past e4m3's maximum and into its subnormals too); on the quick
# profile few rows (Triton's interpreter runs one program a row in Python).
FUSED_SCALES = (1.0, 0.5, TINY_SCALE, HUGE_SCALE)
FUSED_MAX_ROWS, FUSED_MAX_ROWS_QUICK = 300, 24
FUSED_EXAMPLES, FUSED_EXAMPLES_QUICK = 20, 8


@st.composite
def fused_cases(draw, kernel, max_elems: int, max_rows: int):
    """A fused case inside what ``kernel`` declares: the plain draw of its base op (shape, layout,
    distribution, eps, affine), then a write convention, residual dtype and adjacency (the add
    ops), a weight offset and fp8 output it takes."""
    op, fp8 = kernel.op, {v: k for k, v in FP8.items()}
    base = draw(cases(BASE_OP[op], max_elems, max_rows=max_rows,
                      dists=DISTS + (("sum_rounds",) if op in ADD_OPS else ())))
    out = fp8.get(draw(st.one_of(st.none(), st.sampled_from(kernel.out_dtypes))))  # x's dtype half the time at least
    offset = draw(st.sampled_from(kernel.weight_offsets))
    residual = None
    if op in ADD_OPS:
        residual = draw(st.sampled_from([None, *(d for d in kernel.residual_dtypes if d != "same")]))
        residual = None if residual == base.dtype else residual
    case = FusedCase(
        op=op, dtype=base.dtype, shape=base.shape, dist="fp8_max" if out and draw(st.booleans()) else base.dist,
        eps=base.eps, affine="weight_bias" if offset and base.affine == "none" else base.affine, row_pad=base.row_pad,
        residual_dtype=residual, adjacent=op in ADD_OPS and residual is None and draw(st.booleans()),  # one buffer, one dtype
        weight_offset=offset, weight_dist=draw(st.sampled_from(("default", "small"))) if offset else "default",
        out_dtype=out, scale=draw(st.sampled_from(FUSED_SCALES)) if out else None, tags=("fuzz",))
    writes = [w for w in accepted_writes(case) if w in kernel.writes]
    return replace(case, write=draw(st.sampled_from(writes))) if writes else case


@pytest.mark.needs("drawn")
def test_fused_fuzz(fused_kernel, harness_state, request):
    """Drawn fused cases, each judged by the fused oracle check (harness.judging.fused_runner)."""
    quick = harness_state.profile == "quick"
    strategy = fused_cases(fused_kernel, 20_000 if quick else 4_000_000, FUSED_MAX_ROWS_QUICK if quick else FUSED_MAX_ROWS)
    _drawn(fused_kernel, harness_state, request, strategy, FUSED_EXAMPLES_QUICK if quick else FUSED_EXAMPLES,
           lambda case: fused_runner.check_fused(fused_kernel, case, watch=harness_state.watch),
           "harness.judging.fused_cases.fused_case_from_id")


@pytest.mark.needs("drawn")
def test_fuzz(kernel, harness_state, request):
    _fuzz(kernel, harness_state, request, backward=False)


@pytest.mark.needs("drawn_backward")
def test_fuzz_backward(kernel, harness_state, request):
    if not kernel.has_backward:
        pytest.skip(f"{kernel.name} has no backward")
    _fuzz(kernel, harness_state, request, backward=True)


def _fuzz(kernel, harness_state, request, backward: bool):
    quick = harness_state.profile == "quick"
    # A backward draw compiles twice (both passes), and on a CPU an Inductor draw compiles C++:
    # the quick profile draws half as many backward cases as forward ones.
    examples = (6 if backward else 12) if quick else (10 if backward else 20)
    judge = runner.check_backward if backward else runner.check
    _drawn(kernel, harness_state, request, cases(kernel.op, 20_000 if quick else 4_000_000, backward), examples,
           lambda case: judge(kernel, case, watch=harness_state.watch), "harness.judging.cases.case_from_id")


def _drawn(kernel, harness_state, request, strategy, examples: int, judge, rebuild: str):
    """``examples`` cases drawn by ``strategy`` from --fuzz-seed, each judged by ``judge(case)``
    (a CheckResult); a failure records the drawn case and names ``rebuild``, which makes it again
    from its id."""
    if kernel.unavailable():
        pytest.skip(kernel.unavailable())
    failing = {}  # the last failing draw: hypothesis replays its shrunk example last
    device = runner.device_for(kernel)

    @seed(harness_state.selection["fuzz_seed"])  # the same draws every run, so CI repeats itself
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(case=strategy)
    def check(case):
        # A declared known issue is the catalogue's to report (counted apart there), not a draw's:
        # forward and backward alike (a peer that cannot compile a shape class fails its draws too).
        assume(not known_issues.known_issue(kernel, case, device))
        result = judge(case)
        assume(result.skipped is None)  # outside this kernel's range: the catalogue reports those
        if not result.ok:
            failing.update(case=case, result=result)
        assert result.ok, result.failure_message()

    try:
        check()
    except AssertionError:
        if failing:  # the report keeps the drawn case and its errors, not hypothesis's boilerplate
            case, result = failing["case"], failing["result"]
            record(request.node, drawn_case=case.id,
                   errors=[e.to_dict() for e in result.errors], findings=[f.__dict__ for f in result.findings],
                   message=f"drawn case {case.id} (rebuild: {rebuild})\n{result.failure_message()}")
        raise
