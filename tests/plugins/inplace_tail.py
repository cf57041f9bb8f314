"""Planted plug-in: an in-place-only fused add + RMSNorm (eager torch, as FlashInfer's call:
residual += x, x = norm(residual) * (w + offset)) that leaves the row's tail out. It writes y in
vectors of 8 elements and drops the last N % 8 of each row, which keep x's values: every case
whose N is a multiple of 8 passes, every other one fails (tests/test_inplace_held_in.py)."""
import torch

from impls.fused import FusedNormKernel
from impls.registry import register

VECTOR = 8


@register
class InplaceTail(FusedNormKernel):
    op, backend, variant = "add_rms_norm", "inplace_tail", "planted"
    outputs = ("y", "residual_out")
    writes = ("in_place",)
    residual_dtypes = ("same", "float32")
    weight_offsets = (0.0, 1.0)
    devices = ("cpu",)

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = y * (weight.float() + params.weight_offset)
        whole = x.shape[1] - x.shape[1] % VECTOR  # the bug: the tail past the last full vector
        out.residual_out.copy_(s.to(out.residual_out.dtype))
        out.y[:, :whole].copy_(y[:, :whole].to(out.y.dtype))
