"""The project's kernels as PyTorch operators with a backward: ``torch.library.custom_op``s
(``normdiff::rms_norm``, ``normdiff::layer_norm`` and their backward ops) with registered autograd
and fake (meta) implementations, so they run eagerly, in a model, and inside ``torch.compile``
graphs (fullgraph: Dynamo sees one opaque op and traces its shapes through the fake impl).

The backward of each op is the kernel's own (``NormKernel.backward``) from the forward's saved
mean and rstd. Absent weight or bias: the backward op still returns a tensor in its place (a
custom op returns tensors), which autograd drops.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from impls.base import DEFAULT_EPS, NormOutputs
from normdiff._kernels import autograd_inside_op, kernel_for


def _stat(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


def _param(t: Optional[Tensor], x: Tensor) -> Tensor:
    return torch.empty_like(t) if t is not None else x.new_empty((0,))


# -- RMSNorm -----------------------------------------------------------------------------------
@torch.library.custom_op("normdiff::rms_norm", mutates_args=())
def _rms_norm(x: Tensor, weight: Optional[Tensor], eps: float, kernel: str) -> tuple[Tensor, Tensor]:
    out = kernel_for("rms_norm", kernel)(x, weight, None, eps)
    return out.y, out.rstd


@_rms_norm.register_fake
def _(x, weight, eps, kernel):
    return torch.empty_like(x), _stat(x)


@torch.library.custom_op("normdiff::rms_norm_backward", mutates_args=())
def _rms_norm_backward(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor, eps: float,
                       kernel: str) -> tuple[Tensor, Tensor]:
    with autograd_inside_op():
        g = kernel_for("rms_norm", kernel).backward(x, weight, None, dy.contiguous(), NormOutputs(y=x, rstd=rstd), eps)
    return g.dx, g.dw if g.dw is not None else x.new_empty((0,))


@_rms_norm_backward.register_fake
def _(dy, x, weight, rstd, eps, kernel):
    return torch.empty_like(x), _param(weight, x)


def _rms_setup(ctx, inputs, output):
    x, weight, eps, kernel = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.eps, ctx.kernel = eps, kernel


def _rms_grad(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _rms_norm_backward(dy, x, weight, rstd, ctx.eps, ctx.kernel)
    return dx, (dw if weight is not None else None), None, None


_rms_norm.register_autograd(_rms_grad, setup_context=_rms_setup)


# -- LayerNorm ---------------------------------------------------------------------------------
@torch.library.custom_op("normdiff::layer_norm", mutates_args=())
def _layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
                kernel: str) -> tuple[Tensor, Tensor, Tensor]:
    out = kernel_for("layer_norm", kernel)(x, weight, bias, eps)
    return out.y, out.mean, out.rstd


@_layer_norm.register_fake
def _(x, weight, bias, eps, kernel):
    return torch.empty_like(x), _stat(x), _stat(x)


@torch.library.custom_op("normdiff::layer_norm_backward", mutates_args=())
def _layer_norm_backward(dy: Tensor, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor,
                         rstd: Tensor, eps: float, kernel: str) -> tuple[Tensor, Tensor, Tensor]:
    with autograd_inside_op():
        g = kernel_for("layer_norm", kernel).backward(x, weight, bias, dy.contiguous(),
                                                      NormOutputs(y=x, mean=mean, rstd=rstd), eps)
    empty = x.new_empty((0,))
    return g.dx, g.dw if g.dw is not None else empty, g.db if g.db is not None else empty


@_layer_norm_backward.register_fake
def _(dy, x, weight, bias, mean, rstd, eps, kernel):
    return torch.empty_like(x), _param(weight, x), _param(bias, x)


def _ln_setup(ctx, inputs, output):
    x, weight, bias, eps, kernel = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.eps, ctx.kernel = eps, kernel


def _ln_grad(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dw, db = _layer_norm_backward(dy, x, weight, bias, mean, rstd, ctx.eps, ctx.kernel)
    return dx, (dw if weight is not None else None), (db if bias is not None else None), None, None


_layer_norm.register_autograd(_ln_grad, setup_context=_ln_setup)


# -- the functions users call ------------------------------------------------------------------
def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: float = DEFAULT_EPS["rms_norm"], kernel: str = "auto") -> Tensor:
    """RMSNorm over the last dimension with the project's kernel ``kernel`` ("auto", or a
    registered "backend.variant" with a backward, e.g. "triton.invariant"); differentiable."""
    return _rms_norm(x, weight, float(eps), kernel)[0]


def layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = DEFAULT_EPS["layer_norm"],
               kernel: str = "auto") -> Tensor:
    """LayerNorm over the last dimension (see rms_norm for ``kernel``); differentiable."""
    return _layer_norm(x, weight, bias, float(eps), kernel)[0]
