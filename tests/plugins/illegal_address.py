"""An outside backend that makes one illegal global write on its N = 769 cases only, on a GPU
(a Triton store 2^40 elements past y), and computes a correct RMSNorm everywhere else. After the
write the process's CUDA context is unusable: only this kernel's checks may fail.

    pytest harness --backend torch,triton,illegal --backend-file tests/plugins/illegal_address.py
"""
import torch

from impls.base import NormKernel, cuda_present
from impls.registry import register

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _stray_store(ptr, offset):
        tl.store(ptr + offset, 0.0)
except ImportError:  # the kernel then reports itself unavailable
    triton = None


@register
class IllegalAddress(NormKernel):
    op = "rms_norm"
    backend = "illegal"
    variant = "n769"
    outputs = ("y", "rstd")
    devices = ("cuda",)

    def availability(self):
        if triton is None or not cuda_present():
            return "needs triton and a CUDA device (it makes an illegal address on the GPU)"
        return None

    def _forward(self, x, weight, bias, eps, out):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        y = x.float() * rstd[:, None]
        out.y.copy_(y if weight is None else y * weight.float())
        out.rstd.copy_(rstd)
        if x.shape[1] == 769:
            _stray_store[(1,)](out.rstd, 1 << 40)
