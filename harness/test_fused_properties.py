"""Determinism and batch invariance of every fused kernel (impls.fused), forward and backward, bit
for bit, in every write convention it declares (harness.judging.fused_properties), judged as the
plain family's (harness/test_properties.py, harness.judging.properties): a kernel that declares
itself nondeterministic is reported, not failed; one that claims batch invariance
(``batch_invariant``, ``backward_batch_invariant``) fails when a row's bits change with M.

The cases and their conventions: fused_properties.property_pairs (harness.plugin parametrises
them). Valid input a kernel cannot run is a skip with its reason.
"""
import functools

import pytest

from harness.judging import fused_properties, properties, runner
from harness.plugin import record
from harness.running.run import STATE


def _runnable(case, kernel, backward: bool = False) -> str:
    device = runner.device_for(kernel)
    spec = case.spec(device)
    reason = kernel.backward_unsupported(spec) if backward else kernel.unsupported(spec)
    if reason:
        pytest.skip(reason)
    return device


def _quick(request) -> bool:
    return request.config.stash[STATE].profile == "quick"


@pytest.mark.needs("determinism")
def test_fused_deterministic(fused_determinism_case, request):
    case, kernel = fused_determinism_case
    properties.check_determinism(functools.partial(record, request.node), kernel, case, _runnable(case, kernel),
                                 fused_properties.determinism, kernel.nondeterministic)


@pytest.mark.needs("backward_determinism")
def test_fused_backward_deterministic(fused_backward_determinism_case, request):
    case, kernel = fused_backward_determinism_case
    properties.check_determinism(functools.partial(record, request.node), kernel, case,
                                 _runnable(case, kernel, backward=True), fused_properties.backward_determinism,
                                 kernel.backward_nondeterministic, " backward")


@pytest.mark.needs("batch")
def test_fused_batch_invariant(fused_batch_case, request):
    case, kernel = fused_batch_case
    properties.check_batch(functools.partial(record, request.node), kernel, case, _runnable(case, kernel),
                           fused_properties.batch_invariance, _quick(request), kernel.batch_invariant,
                           "test_fused_deterministic")


@pytest.mark.needs("backward_batch")
def test_fused_backward_batch_invariant(fused_backward_batch_case, request):
    """dx and dresidual of sample rows in batches of other sizes (dw and db are sums over the batch)."""
    case, kernel = fused_backward_batch_case
    properties.check_batch(functools.partial(record, request.node), kernel, case,
                           _runnable(case, kernel, backward=True), fused_properties.backward_batch_invariance,
                           _quick(request), kernel.backward_batch_invariant, "test_fused_backward_deterministic", "dx ")
