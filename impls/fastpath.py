"""The host fast path of a kernel call: per call signature, the validated plan and a ready launch.

``NormKernel.validated_call`` validates a call, collapses x into rows, asks the kernel whether it
can run the problem and allocates the outputs. All of that depends only on the call's signature
(``call_signature``): shapes, strides, dtypes and devices of x, weight and bias, and the 16-byte
alignment of their data (compiled kernels specialise on it). The first call of a signature goes
the validated way and leaves a plan (``NormKernel.fast_plan``) in the kernel's call path
(``impls.callpath``); later calls of the same signature, with outputs left to the kernel
(``out=None``) and an eps that is a valid float, run the plan: allocate the outputs and launch.
Every value validation depends on is either in the signature or checked again on each call (eps),
so bad input is refused with the same errors on a warm cache as on a cold one. A plan launches as
the switch of programmatic dependent launch (impls.pdl) stood when it was made: the call path
drops it when the switch changes.

Backends override ``NormKernel.fast_plan`` with leaner launches (Triton: the compiled kernel's
own launcher; TileLang: the compiled kernel called on prepared views); ``generic_plan`` here
skips validation and planning and runs the kernel's ``_forward``.
"""
from __future__ import annotations

import math
import os

import torch

from impls.base import NormOutputs

PLAN_LIMIT = 256  # signatures kept per kernel; a full cache is cleared rather than searched
# NORMDIFF_NO_FAST_PATH=1 makes every call validate (to compare, or to rule the fast path out).
ENABLED = os.environ.get("NORMDIFF_NO_FAST_PATH", "0") != "1"


def _param_signature(t):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return type(t)  # never cached: the validated call refuses it
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def call_signature(x, weight, bias):
    """The key of a call's plan, or None where calls of this kind always validate."""
    if type(x) is not torch.Tensor:
        return None
    return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15,
            _param_signature(weight), _param_signature(bias))


def fast_eps(eps, default: float) -> float | None:
    """eps as the fast path takes it (None: its op's default), or None where the validated call
    must judge it (not a float, negative, NaN or infinite)."""
    if eps is None:
        return default
    if type(eps) is float and 0.0 <= eps < math.inf:
        return eps
    return None


def output_factory(x: torch.Tensor, outputs: tuple[str, ...]):
    """A function ``alloc(x) -> (y, mean, rstd)`` making the outputs as the validated call does: y
    contiguous in x's shape and dtype; mean and rstd float32 in x's leading shape, None where the
    kernel does not write them. y is allocated like x where x is contiguous (empty_like parses
    less than empty(shape, dtype=, device=): each allocation costs several µs of host time). Each
    output has storage of its own: outputs that alias each other are refused by torch.library's
    custom ops (normdiff.ops) and would surprise a caller."""
    shape, dtype, device, lead = x.shape, x.dtype, x.device, x.shape[:-1]
    like = x.is_contiguous()
    f32 = torch.float32
    want_mean, want_rstd = "mean" in outputs, "rstd" in outputs

    def alloc(x):
        y = torch.empty_like(x) if like else torch.empty(shape, dtype=dtype, device=device)
        return (y, torch.empty(lead, dtype=f32, device=device) if want_mean else None,
                torch.empty(lead, dtype=f32, device=device) if want_rstd else None)

    return alloc


def generic_plan(x: torch.Tensor, x2: torch.Tensor, outputs: tuple[str, ...], forward):
    """A plan that allocates the outputs and runs ``forward(x2, weight, bias, eps, out2)`` on rows
    viewed as the validated call viewed them."""
    m, n = x2.shape
    row_stride = x2.stride(0)
    contiguous = x.is_contiguous()
    alloc = output_factory(x, outputs)

    def plan(x, weight, bias, eps):
        y, mean, rstd = alloc(x)
        rows = x.view(m, n) if contiguous else x.as_strided((m, n), (row_stride, 1))
        forward(rows, weight, bias, eps, NormOutputs(
            y=y.view(m, n), mean=None if mean is None else mean.view(-1), rstd=None if rstd is None else rstd.view(-1)))
        return NormOutputs(y, mean, rstd)

    return plan


__all__ = ["PLAN_LIMIT", "call_signature", "fast_eps", "generic_plan", "output_factory"]
