"""The fused family (impls.fused: the residual add, Gemma's (1 + w), the fp8 output) against the
float64 oracle: every fused kernel on every fused case with the case's write convention, its
backward, and the inputs the interface refuses (harness.judging.fused_runner)."""
import pytest
import torch

from harness.judging.family import family
from harness.plugin import expect_known_issue, record
from impls.fused import ADD_OPS, BASE_OP, NormInputError


@pytest.mark.needs("oracle")
def test_fused_against_oracle(fused_case_kernel, harness_state, request):
    case, kernel = fused_case_kernel
    expect_known_issue(request, kernel, case)
    result = family(kernel.family).check(kernel, case, watch=harness_state.watch)
    if result.skipped:
        pytest.skip(result.skipped)
    record(request.node, errors=[e.to_dict() for e in result.errors], findings=[f.__dict__ for f in result.findings],
           declaration=kernel.declaration())
    assert result.ok, result.failure_message()


@pytest.mark.needs("backward")
def test_fused_backward(fused_backward_case_kernel, harness_state, request):
    case, kernel = fused_backward_case_kernel
    expect_known_issue(request, kernel, case)
    result = family(kernel.family).check_backward(kernel, case, watch=harness_state.watch)
    if result.skipped:
        pytest.skip(result.skipped)
    record(request.node, errors=[e.to_dict() for e in result.errors], findings=[f.__dict__ for f in result.findings])
    assert result.ok, result.failure_message()


def _bad_calls(op: str):
    """(what is wrong, the words the error must name, a call's keyword arguments) for ``op``."""
    n = 64
    x = torch.randn(4, n)
    w = torch.randn(n)
    calls = []
    if op in ADD_OPS:
        buf = torch.randn(4, 2 * n)
        calls += [
            ("overlapping x and residual", "overlap", dict(x=buf[:, :n], residual=buf[:, n // 2: n // 2 + n], weight=w)),
            ("x as its own residual", "overlap", dict(x=x, residual=x, weight=w)),
            ("no residual", "residual", dict(x=x, residual=None, weight=w)),
            ("residual of another shape", "residual has shape", dict(x=x, residual=torch.randn(4, n + 1), weight=w)),
            ("an integer residual", "residual has dtype", dict(x=x, residual=torch.ones(4, n, dtype=torch.int32), weight=w)),
            ("an unknown write convention", "write must be", dict(x=x, residual=torch.randn(4, n), weight=w, write="both")),
        ]
    else:
        calls.append(("a residual to a plain op", "takes no residual", dict(x=x, residual=torch.randn(4, n), weight=w)))
        calls.append(("in place on a plain op", "convention of the add ops", dict(x=x, weight=w, write="in_place")))
    residual = torch.randn(4, n) if op in ADD_OPS else None
    if BASE_OP[op] == "layer_norm":
        calls.append(("an offset on LayerNorm", "weight_offset", dict(x=x, residual=residual, weight=w, weight_offset=1.0)))
    else:
        calls.append(("an offset without a weight", "weight_offset", dict(x=x, residual=residual, weight_offset=1.0)))
        calls.append(("a non-finite offset", "weight_offset", dict(x=x, residual=residual, weight=w, weight_offset=float("nan"))))
    calls += [
        ("fp8 without a scale", "scale", dict(x=x, residual=residual, weight=w, out_dtype=torch.float8_e4m3fn)),
        ("a zero scale", "scale", dict(x=x, residual=residual, weight=w, out_dtype=torch.float8_e4m3fn, scale=0.0)),
        ("a scale without fp8", "scale", dict(x=x, residual=residual, weight=w, scale=2.0)),
        ("a 16-bit out_dtype", "out_dtype", dict(x=x, residual=residual, weight=w, out_dtype=torch.float16)),
    ]
    if op == "add_layer_norm":
        calls.append(("fp8 from add_layer_norm", "not add_layer_norm", dict(x=x, residual=residual, weight=w,
                                                                          out_dtype=torch.float8_e4m3fn, scale=1.0)))
    elif op in ADD_OPS:
        calls.append(("fp8 y into x", "in_place", dict(x=x, residual=residual, weight=w, out_dtype=torch.float8_e4m3fn,
                                                          scale=1.0, write="in_place")))
    return calls


@pytest.mark.needs("small")
def test_fused_bad_input(fused_kernel):
    """Every fused kernel, available here or not, refuses each bad call with a NormInputError
    that names the problem, before any backend code runs."""
    failures = []
    for what, words, kwargs in _bad_calls(fused_kernel.op):
        try:
            fused_kernel(**kwargs)
        except NormInputError as exc:
            if words not in str(exc):
                failures.append(f"{what}: the error does not name it ({words!r}): {exc}")
        except Exception as exc:  # noqa: BLE001 (any other error is the finding)
            failures.append(f"{what}: {type(exc).__name__}: {exc}")
        else:
            failures.append(f"{what}: accepted")
    assert not failures, f"{fused_kernel.name} ({fused_kernel.op}):\n" + "\n".join(failures)
