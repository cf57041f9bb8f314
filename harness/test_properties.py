"""Determinism and batch invariance of every selected kernel, bit for bit (harness.judging.properties).

A kernel that declares itself nondeterministic (``NormKernel.nondeterministic``) or not
batch-invariant (``batch_invariant = False``) is measured and reported, not failed; one that
claims batch invariance (``True``) fails when a row's bits change with M. An unknown claim
(``None``) is measured and reported.

Valid input a kernel cannot run (``UnsupportedCase``) is a skip with its reason, and a call that
fails on a case the kernel declares a known issue on is that issue (``properties.judging``).
"""
import functools

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


@pytest.mark.needs("determinism")
def test_deterministic(determinism_case, request):
    case, kernel = determinism_case
    properties.check_determinism(functools.partial(record, request.node), kernel, case, _runnable(case, kernel),
                                 properties.determinism, kernel.nondeterministic)


@pytest.mark.needs("batch")
def test_batch_invariant(batch_case, request):
    case, kernel = batch_case
    properties.check_batch(functools.partial(record, request.node), kernel, case, _runnable(case, kernel),
                           properties.batch_invariance, request.config.stash[STATE].profile == "quick",
                           kernel.batch_invariant, "test_deterministic")
