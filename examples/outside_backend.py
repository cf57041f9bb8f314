"""An outside backend: a file normdiff has never seen, selected with

    pytest harness --backend-file examples/outside_backend.py --backend mynorm

It registers one kernel per op. Any kernel is a NormKernel subclass that names its op, backend and
variant, lists the outputs it writes, and fills the given output buffers in ``_forward``.
"""
import torch

from impls.base import NormKernel
from impls.registry import register


@register
class MyRMSNorm(NormKernel):
    op = "rms_norm"
    backend = "mynorm"
    variant = "float32"
    outputs = ("y", "rstd")

    def _forward(self, x, weight, bias, eps, out):
        # x: (M, N) rows (row stride may exceed N); out.y: (M, N); out.rstd: (M,) float32
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
        y = xf * rstd[:, None]
        out.y.copy_(y if weight is None else y * weight.float())
        out.rstd.copy_(rstd)


@register
class MyLayerNorm(NormKernel):
    op = "layer_norm"
    backend = "mynorm"
    variant = "float32"
    outputs = ("y", "mean", "rstd")

    def _forward(self, x, weight, bias, eps, out):
        xf = x.float()
        mean = xf.mean(-1)
        rstd = torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + eps)
        y = (xf - mean[:, None]) * rstd[:, None]
        if weight is not None:
            y = y * weight.float()
        if bias is not None:
            y = y + bias.float()
        out.y.copy_(y)
        out.mean.copy_(mean)
        out.rstd.copy_(rstd)
