"""Planted plug-in: an in-place-only fused add + RMSNorm (eager torch, as FlashInfer's call:
residual += x, x = norm(residual) * (w + offset)) whose statistics leak across rows. Each row's
mean square carries a weightless term of the row before (as a kernel that keeps one accumulator
for consecutive rows and scales the old sum by zero instead of resetting it): 0 * NaN is NaN, so
a NaN row makes the next row NaN too. Finite inputs give the right result; the NaN rows' cases
fail (tests/test_inplace_held_in.py)."""
import torch

from impls.fused import FusedNormKernel
from impls.registry import register


@register
class InplaceNanLeak(FusedNormKernel):
    op, backend, variant = "add_rms_norm", "inplace_nan_leak", "planted"
    outputs = ("y", "residual_out")
    writes = ("in_place",)
    residual_dtypes = ("same", "float32")
    weight_offsets = (0.0, 1.0)
    devices = ("cpu",)

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()
        ms = s.pow(2).mean(-1)
        carried = torch.cat([ms.new_zeros(1), ms[:-1]])  # the row before's sum
        ms = ms + 0.0 * carried  # the bug: the old sum zeroed by a multiply, not reset
        y = s * torch.rsqrt(ms + eps)[:, None]
        if weight is not None:
            y = y * (weight.float() + params.weight_offset)
        out.residual_out.copy_(s.to(out.residual_out.dtype))
        out.y.copy_(y.to(out.y.dtype))
