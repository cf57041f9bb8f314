"""``torch.autograd.Function``s over the project's kernels, for eager code that wants the
Function itself (``RMSNormFunction.apply(x, weight, eps, kernel)``). Inside ``torch.compile``
use ``normdiff.rms_norm`` / ``layer_norm`` (custom ops with a fake impl) or the modules: Dynamo
would trace through a Function's forward into the kernel's launch code. AddRMSNormFunction /
AddLayerNormFunction return (y, residual_out) of the fused ops' new-outputs form, with their
autograd formula (normdiff.fused_ops)."""
from __future__ import annotations

import torch

from impls.base import DEFAULT_EPS, NormOutputs
from normdiff import fused_ops
from normdiff._kernels import kernel_for


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight=None, eps: float = DEFAULT_EPS["rms_norm"], kernel: str = "auto"):
        out = kernel_for("rms_norm", kernel)(x, weight, None, eps)
        ctx.save_for_backward(x, weight, out.rstd)
        ctx.eps, ctx.kernel = eps, kernel
        return out.y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        g = kernel_for("rms_norm", ctx.kernel).backward(x, weight, None, dy.contiguous(),
                                                        NormOutputs(y=x, rstd=rstd), ctx.eps)
        return g.dx, g.dw, None, None


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight=None, bias=None, eps: float = DEFAULT_EPS["layer_norm"], kernel: str = "auto"):
        out = kernel_for("layer_norm", kernel)(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, out.mean, out.rstd)
        ctx.eps, ctx.kernel = eps, kernel
        return out.y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        g = kernel_for("layer_norm", ctx.kernel).backward(x, weight, bias, dy.contiguous(),
                                                          NormOutputs(y=x, mean=mean, rstd=rstd), ctx.eps)
        return g.dx, g.dw, g.db, None, None


def _fused_forward(ctx, op: str, x, residual, weight, bias, eps: float, weight_offset: float, kernel: str):
    inputs = (x, residual, weight, bias, float(eps), float(weight_offset), None, None, kernel)
    output = fused_ops._NEW[op](*inputs)
    fused_ops._setup(op, ctx, inputs, output)
    return output[0], output[1]


class AddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight=None, eps: float = DEFAULT_EPS["rms_norm"], weight_offset: float = 0.0,
                kernel: str = "auto"):
        return _fused_forward(ctx, "add_rms_norm", x, residual, weight, None, eps, weight_offset, kernel)

    @staticmethod
    def backward(ctx, dy, d_residual_out):
        dx, dres, dw, _, *_ = fused_ops._grad(ctx, dy, d_residual_out)
        return dx, dres, dw, None, None, None


class AddLayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight=None, bias=None, eps: float = DEFAULT_EPS["layer_norm"], kernel: str = "auto"):
        return _fused_forward(ctx, "add_layer_norm", x, residual, weight, bias, eps, 0.0, kernel)

    @staticmethod
    def backward(ctx, dy, d_residual_out):
        dx, dres, dw, db, *_ = fused_ops._grad(ctx, dy, d_residual_out)
        return dx, dres, dw, db, None, None
