"""Every selected kernel's backward against the float64 oracle, on the backward catalogue
(harness.judging.cases.backward_catalogue): the kernel's own forward (for its saved mean and rstd), then
its backward into poisoned, canaried dx, dw and db (harness.judging.guards), each gradient judged with its
derived allowance (harness.judging.compare_backward); and the backward's determinism, bit for bit.

A kernel without a backward is skipped with that reason (``<name> has no backward``).
"""
import functools

import pytest

from harness.judging import compare_backward, properties, runner
from harness.running import memory_watch
from harness.plugin import expect_known_issue, record
from harness.running.run import STATE

_ORACLE = runner.BackwardOracleCache()  # one per process: a case's checks run one after another
_LAST: dict = {"case": None, "grads": {}, "allowances": {}}  # the last case here: its kernels' gradients, its allowances


def _forget() -> None:
    _ORACLE.forget()
    _LAST.update(case=None, grads={}, allowances={})


memory_watch.register_cache("the backward's oracle and kept gradients", lambda: (_ORACLE, _LAST), _forget)


def pytest_generate_tests(metafunc):
    state = metafunc.config.stash.get(STATE, None)
    if state is None:
        return
    for name, cases in (("backward_case", state.backward_cases),
                        ("backward_determinism_case", properties.determinism_cases(state.backward_cases, state.profile)),
                        ("backward_batch_case", state.backward_batch_cases)):
        if name in metafunc.fixturenames:
            pairs = [(c, k) for c in cases for k in state.kernels if k.op == c.op]
            metafunc.parametrize(name, pairs, ids=[f"{c.id}-{k.name}" for c, k in pairs])


def _agreement(result) -> list[tuple]:
    """This check's gradients against those of every kernel that ran the same case before it in
    this process, as agreement cells of the op's backward table (op "<op> backward")."""
    case = result.case
    if case.id != _LAST["case"]:
        _LAST.update(case=case.id, grads={}, allowances={})
    if result.grads is None:
        return []
    ref = _ORACLE.get(case, result.grads.dx.device.type)[3]
    mine = (result.grads, result.stat_dtype)
    cells = []
    for other, (d, output) in compare_backward.agreements(ref, case.torch_dtype, mine, _LAST["grads"],
                                                           _LAST["allowances"]).items():
        a, b = sorted((result.kernel, other))
        cells.append((f"{case.op} backward", case.dtype, a, b, float(d), f"{case.id} ({output})"))
    _LAST["grads"][result.kernel] = mine
    return cells


@pytest.mark.needs("backward")
def test_backward(backward_case, harness_state, request):
    case, kernel = backward_case
    if kernel.has_backward:
        expect_known_issue(request, kernel, case)
    result = runner.check_backward(kernel, case, oracle=_ORACLE, keep_outputs=True, watch=harness_state.watch)
    if result.skipped:
        pytest.skip(result.skipped)
    record(request.node, errors=[e.to_dict() for e in result.errors], findings=[f.__dict__ for f in result.findings])
    request.node.user_properties.append(("normdiff_agreement", _agreement(result)))
    assert result.ok, result.failure_message()


@pytest.mark.needs("backward_determinism")
def test_backward_deterministic(backward_determinism_case, request):
    case, kernel = backward_determinism_case
    device = runner.device_for(kernel)
    reason = kernel.backward_unsupported(case.spec(device))
    if reason:
        pytest.skip(reason)
    properties.check_determinism(functools.partial(record, request.node), kernel, case, device,
                                 properties.backward_determinism, kernel.backward_nondeterministic, " backward")


@pytest.mark.needs("backward_batch")
def test_backward_batch_invariant(backward_batch_case, request):
    """dx of sample rows recomputed in batches of other sizes (properties.backward_batch_invariance),
    bit for bit: a kernel that claims it (``backward_batch_invariant = True``) fails when a row's
    dx changes with M; one that does not is measured and reported."""
    case, kernel = backward_batch_case
    device = runner.device_for(kernel)
    reason = kernel.backward_unsupported(case.spec(device))
    if reason:
        pytest.skip(reason)
    properties.check_batch(functools.partial(record, request.node), kernel, case, device,
                           properties.backward_batch_invariance, request.config.stash[STATE].profile == "quick",
                           kernel.backward_batch_invariant, "test_backward_deterministic", "dx ")
