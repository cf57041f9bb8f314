"""Determinism and batch invariance of every selected kernel, bit for bit (harness.judging.properties).

A kernel that declares itself nondeterministic (``NormKernel.nondeterministic``) or not
batch-invariant (``batch_invariant = False``) is measured and reported, not failed; one that
claims batch invariance (``True``) fails when a row's bits change with M. An unknown claim
(``None``) is measured and reported.

Valid input a kernel cannot run (``UnsupportedCase``) is a skip with its reason, and a call that
fails on a case the kernel declares a known issue on is that issue (``properties.judging``).
"""
import pytest

from harness.judging import properties, runner
from harness.plugin import record
from harness.running.run import STATE


def pytest_generate_tests(metafunc):
    state = metafunc.config.stash.get(STATE, None)
    if state is None:
        return
    for name, cases in (("determinism_case", properties.determinism_cases(state.cases, state.profile)),
                        ("batch_case", state.batch_cases)):
        if name in metafunc.fixturenames:
            pairs = [(c, k) for c in cases for k in state.kernels if k.op == c.op]
            metafunc.parametrize(name, pairs, ids=[f"{c.id}-{k.name}" for c, k in pairs])


def _runnable(case, kernel) -> str:
    device = runner.device_for(kernel)
    reason = kernel.unsupported(case.spec(device))
    if reason:
        pytest.skip(reason)
    return device


def test_deterministic(determinism_case, request):
    case, kernel = determinism_case
    device = _runnable(case, kernel)
    with properties.judging(kernel, case, device):
        diffs = properties.determinism(kernel, case, device)
    record(request.node, deterministic=not diffs, bit_diffs=[d.__dict__ for d in diffs],
           **({"failure_kind": "nondeterministic"} if diffs and not kernel.nondeterministic else {}))
    if diffs and kernel.nondeterministic:
        pytest.xfail(f"declared nondeterministic ({kernel.nondeterministic}): "
                     + "; ".join(d.summary() for d in diffs))
    assert not diffs, "nondeterministic: two calls on identical inputs differ: " + "; ".join(d.summary() for d in diffs)


def test_batch_invariant(batch_case, request):
    case, kernel = batch_case
    device = _runnable(case, kernel)
    with properties.judging(kernel, case, device):
        result = properties.batch_invariance(kernel, case, device, quick=request.config.stash[STATE].profile == "quick")
    if result.nondeterministic:
        pytest.skip("two calls on the full batch differ (test_deterministic reports it): batch invariance "
                    "cannot be judged")
    record(request.node, batch_invariant=result.invariant, batch_sizes=result.sizes,
           batch_changes={str(m): v for m, v in result.changes.items()}, batch_claim=kernel.batch_invariant,
           **({"failure_kind": "batch-variant"} if not result.invariant and kernel.batch_invariant else {}))
    if kernel.batch_invariant:
        assert result.invariant, f"batch-variant, though {kernel.name} claims batch invariance: {result.summary()}"
