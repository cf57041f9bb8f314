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


def _determinism(request, pair, backward: bool) -> None:
    case, kernel = pair
    measure = fused_properties.backward_determinism if backward else fused_properties.determinism
    declared = kernel.backward_nondeterministic if backward else kernel.nondeterministic
    properties.check_determinism(functools.partial(record, request.node), kernel, case,
                                 _runnable(case, kernel, backward), measure, declared, " backward" if backward else "")


def _batch(request, pair, backward: bool) -> None:
    """Backward: dx and dresidual of sample rows in batches of other sizes (dw and db are sums over
    the batch)."""
    case, kernel = pair
    measure = fused_properties.backward_batch_invariance if backward else fused_properties.batch_invariance
    claim = kernel.backward_batch_invariant if backward else kernel.batch_invariant
    twin = "test_fused_backward_deterministic" if backward else "test_fused_deterministic"
    properties.check_batch(functools.partial(record, request.node), kernel, case, _runnable(case, kernel, backward),
                           measure, request.config.stash[STATE].profile == "quick", claim, twin,
                           "dx " if backward else "")


@pytest.mark.needs("determinism")
def test_fused_deterministic(fused_determinism_case, request):
    _determinism(request, fused_determinism_case, False)


@pytest.mark.needs("backward_determinism")
def test_fused_backward_deterministic(fused_backward_determinism_case, request):
    _determinism(request, fused_backward_determinism_case, True)


@pytest.mark.needs("batch")
def test_fused_batch_invariant(fused_batch_case, request):
    _batch(request, fused_batch_case, False)


@pytest.mark.needs("backward_batch")
def test_fused_backward_batch_invariant(fused_backward_batch_case, request):
    _batch(request, fused_backward_batch_case, True)
