"""``torch.autograd.Function``s over the project's kernels, for eager code that wants the
Function itself (``RMSNormFunction.apply(x, weight, eps, kernel)``). Inside ``torch.compile``
use ``normdiff.rms_norm`` / ``layer_norm`` (custom ops with a fake impl) or the modules: Dynamo
would trace through a Function's forward into the kernel's launch code."""
from __future__ import annotations

import torch

from impls.base import DEFAULT_EPS, NormOutputs
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
