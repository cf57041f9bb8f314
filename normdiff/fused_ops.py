"""The fused ops ``normdiff.add_rms_norm`` / ``add_layer_norm``: residual_out = x + residual, then
the norm of it, on the project's fused kernels (impls.fused; kernel="auto": triton.fused where
Triton runs, else torch.fused), in the two write conventions users call:

- write="new": y and residual_out are new tensors. Functional custom ops ``normdiff::add_rms_norm``
  / ``add_layer_norm`` with fake impls and an autograd formula: the kernel's fused backward
  (``FusedNormKernel.backward``, itself the custom op ``normdiff::<op>_backward``) gives dx,
  dresidual, dw and db.
- write="in_place": y into x's storage, residual_out into residual's. Custom ops
  ``normdiff::add_rms_norm_`` / ``add_layer_norm_`` declaring that they mutate x and residual, so
  torch.compile functionalises them. No autograd: overwriting tensors autograd tracks would need
  their history rebased, which a custom op cannot do, so add_rms_norm / add_layer_norm refuse the
  call where grad mode is on and an input requires grad (the op itself, called through torch.ops,
  runs below autograd and cannot tell).

An fp8 y (add_rms_norm's out_dtype and scale) has no backward either and is refused the same way.
Everything else about the input is checked by the kernel's call (impls.fused_validation), with
the fused interface's NormInputError.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from impls.base import DEFAULT_EPS
from impls.fused import FusedGrads, FusedOutputs
from impls.inputs import NormInputError
from normdiff._kernels import autograd_inside_op, kernel_for
from normdiff.ops import _param, _stat

WRITES = ("new", "in_place")


def refuse_grad(what: str, *tensors) -> None:
    """NormInputError where autograd would be asked to differentiate a call that has no backward."""
    if not torch.is_grad_enabled():
        return
    for t in tensors:
        if t is not None and t.requires_grad:
            raise NormInputError(f"{what} has no backward, and an input requires grad: call it under "
                                 "torch.no_grad() or on detached tensors, or use write='new' with x's dtype "
                                 "(differentiable)")


def _stats(k, x: Tensor, out: FusedOutputs | None = None) -> tuple[Tensor, Tensor]:
    """mean and rstd as the ops return them: the kernel's (fake ones where out is None), an empty
    stand-in for one it does not write (a custom op returns tensors)."""
    empty = x.new_empty((0,), dtype=torch.float32)
    if out is None:
        return tuple(_stat(x) if name in k.outputs else empty for name in ("mean", "rstd"))
    return tuple(t if t is not None else empty for t in (out.mean, out.rstd))


# -- the ops, one set per fused op -------------------------------------------------------------
def _define_new(op: str):
    @torch.library.custom_op(f"normdiff::{op}", mutates_args=())
    def new(x: Tensor, residual: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
            weight_offset: float, out_dtype: Optional[torch.dtype], scale: Optional[float],
            kernel: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        k = kernel_for(op, kernel)
        out = k(x, residual, weight, bias, eps, weight_offset=weight_offset, out_dtype=out_dtype, scale=scale)
        return (out.y, out.residual_out, *_stats(k, x, out))

    @new.register_fake
    def _(x, residual, weight, bias, eps, weight_offset, out_dtype, scale, kernel):
        k = kernel_for(op, kernel)
        return (x.new_empty(x.shape, dtype=out_dtype or x.dtype),
                x.new_empty(x.shape, dtype=k.residual_out_dtype(x.dtype, residual.dtype)), *_stats(k, x))

    new.register_autograd(_grad, setup_context=lambda ctx, inputs, output: _setup(op, ctx, inputs, output))
    return new


def _define_in_place(op: str):
    @torch.library.custom_op(f"normdiff::{op}_", mutates_args=("x", "residual"))
    def in_place(x: Tensor, residual: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
                 weight_offset: float, out_dtype: Optional[torch.dtype], scale: Optional[float], kernel: str) -> None:
        kernel_for(op, kernel)(x, residual, weight, bias, eps, weight_offset=weight_offset, out_dtype=out_dtype,
                               scale=scale, write="in_place")

    @in_place.register_fake
    def _(x, residual, weight, bias, eps, weight_offset, out_dtype, scale, kernel):
        return None

    return in_place


def _define_backward(op: str):
    @torch.library.custom_op(f"normdiff::{op}_backward", mutates_args=())
    def backward(dy: Tensor, d_residual_out: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor],
                 residual_out: Tensor, mean: Tensor, rstd: Tensor, x_dtype: torch.dtype, residual_dtype: torch.dtype,
                 eps: float, weight_offset: float, kernel: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        k = kernel_for(op, kernel)
        g = FusedGrads(dx=dy.new_empty(dy.shape, dtype=x_dtype), dresidual=dy.new_empty(dy.shape, dtype=residual_dtype),
                       dw=None if weight is None else torch.empty_like(weight),
                       db=None if bias is None else torch.empty_like(bias))
        saved = FusedOutputs(y=residual_out, residual_out=residual_out, rstd=rstd,
                             mean=mean if "mean" in k.outputs else None)
        # The add ops' backward differentiates at residual_out; x and residual only describe the
        # call (shape, dtype), so the gradient buffers stand in for them and the forward keeps
        # neither alive.
        with autograd_inside_op():
            k.backward(g.dx, g.dresidual, weight, bias, dy, saved, eps, d_residual_out=d_residual_out,
                       weight_offset=weight_offset, out=g)
        return g.dx, g.dresidual, _or_empty(g.dw, dy), _or_empty(g.db, dy)

    @backward.register_fake
    def _(dy, d_residual_out, weight, bias, residual_out, mean, rstd, x_dtype, residual_dtype, eps, weight_offset,
          kernel):
        return (dy.new_empty(dy.shape, dtype=x_dtype), dy.new_empty(dy.shape, dtype=residual_dtype),
                _param(weight, dy), _param(bias, dy))

    return backward


def _or_empty(t: Tensor | None, like: Tensor) -> Tensor:
    return t if t is not None else like.new_empty((0,))


def _setup(op: str, ctx, inputs, output) -> None:
    x, residual, weight, bias, eps, weight_offset, out_dtype, _scale, kernel = inputs
    ctx.save_for_backward(weight, bias, *output[1:])
    ctx.op, ctx.fp8 = op, out_dtype is not None
    ctx.call = (x.dtype, residual.dtype, eps, weight_offset, kernel)


def _grad(ctx, dy, d_residual_out, _dmean=None, _drstd=None):
    """Gradients of the functional op's inputs (x, residual, weight, bias, then its scalars)."""
    if ctx.fp8:
        raise NormInputError(f"normdiff.{ctx.op} with an fp8 output has no backward")
    weight, bias, residual_out, mean, rstd = ctx.saved_tensors
    dx, dres, dw, db = _BACKWARD[ctx.op](dy, d_residual_out, weight, bias, residual_out, mean, rstd, *ctx.call)
    dw, db = (dw if weight is not None else None), (db if bias is not None else None)
    return dx, dres, dw, db, None, None, None, None, None


_BACKWARD = {op: _define_backward(op) for op in ("add_rms_norm", "add_layer_norm")}
_NEW = {op: _define_new(op) for op in _BACKWARD}
_IN_PLACE = {op: _define_in_place(op) for op in _BACKWARD}


# -- the functions users call ------------------------------------------------------------------
def call(op: str, x, residual, weight, bias, eps, weight_offset, out_dtype, scale, write, kernel):
    """(y, residual_out) of the fused op ``op``: new tensors, or x and residual written in place."""
    if write not in WRITES:
        raise NormInputError(f"normdiff.{op} writes {' or '.join(map(repr, WRITES))} (y and residual_out as new "
                             f"tensors, or into x and residual); got write={write!r}")
    args = (x, residual, weight, bias, float(eps), float(weight_offset), out_dtype,
            None if scale is None else float(scale), kernel)
    if write == "in_place":
        refuse_grad(f"normdiff.{op}(write='in_place')", x, residual, weight, bias)
        _IN_PLACE[op](*args)
        return x, residual
    if out_dtype is not None:
        refuse_grad(f"normdiff.{op} with an fp8 output", x, residual, weight, bias)
    y, residual_out, _, _ = _NEW[op](*args)
    return y, residual_out


def add_rms_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, eps: float = DEFAULT_EPS["rms_norm"], *,
                 weight_offset: float = 0.0, out_dtype: Optional[torch.dtype] = None, scale: Optional[float] = None,
                 write: str = "new", kernel: str = "auto") -> tuple[Tensor, Tensor]:
    """(y, residual_out): residual_out = x + residual, y = RMSNorm(residual_out) with weight
    ``weight_offset + w`` (1 for Gemma's), y in fp8 ``out_dtype`` divided by ``scale`` where given.
    write="in_place" puts y into x and residual_out into residual and returns them. Differentiable
    (write="new", no fp8); ``kernel`` as normdiff.rms_norm's ("auto": triton.fused, else torch.fused)."""
    return call("add_rms_norm", x, residual, weight, None, eps, weight_offset, out_dtype, scale, write, kernel)


def add_layer_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                   eps: float = DEFAULT_EPS["layer_norm"], *, write: str = "new",
                   kernel: str = "auto") -> tuple[Tensor, Tensor]:
    """(y, residual_out) with LayerNorm; see add_rms_norm."""
    return call("add_layer_norm", x, residual, weight, bias, eps, 0.0, None, None, write, kernel)
