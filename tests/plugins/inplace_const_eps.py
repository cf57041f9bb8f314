"""Planted plug-in: an in-place-only fused add + RMSNorm (eager torch, as FlashInfer's call:
residual += x, x = norm(residual) * (w + offset)) that ignores the caller's eps and uses 1e-6,
the op's default: every case at the default eps passes, a case with another eps (eps 0.1) fails
(tests/test_inplace_held_in.py)."""
import torch

from impls.fused import FusedNormKernel
from impls.registry import register

EPS = 1e-6


@register
class InplaceConstEps(FusedNormKernel):
    op, backend, variant = "add_rms_norm", "inplace_const_eps", "planted"
    outputs = ("y", "residual_out")
    writes = ("in_place",)
    residual_dtypes = ("same", "float32")
    weight_offsets = (0.0, 1.0)
    devices = ("cpu",)

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS)  # the bug: not the eps given
        if weight is not None:
            y = y * (weight.float() + params.weight_offset)
        out.residual_out.copy_(s.to(out.residual_out.dtype))
        out.y.copy_(y.to(out.y.dtype))
