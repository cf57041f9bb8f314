"""A kernel's declared known issue on a case (``NormKernel.known_issue``), asked with what a
declaration may read: the case itself, and the case's inputs as its checks draw them, drawn only
where the kernel calls for them (``inputs``). Every caller asks through here."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from harness.judging import compare_backward
from harness.judging.cases import Case
from harness.judging.inputs import make_dy, make_inputs
from impls.base import NormKernel
from impls.fused import is_fused
from impls.reference import reference, reference_backward


@dataclass
class Drawn:
    """A case's inputs as its checks draw them on one device; dy None for a forward case."""

    kernel: NormKernel
    case: Case
    x: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    dy: torch.Tensor | None

    def allowance(self, name: str) -> torch.Tensor:
        """The error the backward check allows in each element of gradient ``name`` ("dx", "dw" or
        "db"; float64, the gradient's shape), under the kernel's statistics dtype."""
        if self.dy is None:
            raise ValueError(f"{self.case.id} is a forward case: no gradient allowance")
        op, x, w, b, eps = self.case.op, self.x, self.weight, self.bias, self.eps
        grads = reference_backward(op, x, self.dy, w, b, eps)
        ref = compare_backward.BackwardReference(op, x, self.dy, w, b, grads, reference(op, x, None, None, eps))
        stat_dtype = self.kernel.stat_dtype(x.dtype, x.device.type)
        return compare_backward.allowances_of(ref, x.dtype, stat_dtype)[name]


def inputs_of(kernel: NormKernel, case: Case, device: str) -> Callable[[], Drawn] | None:
    """What ``known_issue`` gets as ``inputs``: a zero-argument callable drawing the case's inputs
    once, on first call. None for the fused family, whose checks draw their own."""
    if is_fused(kernel):
        return None
    if device == "cuda" and not torch.cuda.is_available():  # no card here to draw them on
        return None

    @functools.cache
    def draw() -> Drawn:
        inp = make_inputs(case, device)
        dy = make_dy(case, device)[0] if case.dy_dist is not None else None
        return Drawn(kernel, case, inp.x, inp.weight, inp.bias, inp.eps, dy)

    return draw


def known_issue(kernel: NormKernel, case: Case, device: str) -> str | None:
    return kernel.known_issue(case, device, inputs=inputs_of(kernel, case, device))


def known_issue_may_pass(kernel: NormKernel, case: Case, device: str) -> bool:
    return kernel.known_issue_may_pass(case, device, inputs=inputs_of(kernel, case, device))
