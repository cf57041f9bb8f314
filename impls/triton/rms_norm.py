"""RMSNorm in Triton: rowwise (the whole row in one tile), looped (the row in chunks) and split
(the row over several programs)."""
from __future__ import annotations

from impls.base import NormOutputs
from impls.registry import register
from impls.triton._launch import RowwiseKernel, TritonKernel
from impls.triton._split import SplitRowsKernel
from impls.triton.settings import LaunchConfig


class _TritonRMSNorm(TritonKernel):
    op = "rms_norm"
    outputs = ("y", "rstd")
    _kernel_name: str

    def _forward(self, x, weight, bias, eps, out: NormOutputs, cfg: LaunchConfig | None = None) -> None:
        m, n = x.shape
        cfg = cfg or self.config(n, x.dtype, m)  # an explicit cfg: tools/triton_sweep.py
        w = weight if weight is not None else x  # never read when HAS_WEIGHT is off
        self.run(x, cfg, (x, w, out.y, out.rstd), (m, n, x.stride(0), out.y.stride(0), eps),
                 HAS_WEIGHT=weight is not None)


@register
class TritonRMSNormRowwise(RowwiseKernel, _TritonRMSNorm):
    _kernel_name = "rms_norm_rowwise"
    _row_kernel_name = "rms_norm_row"


@register
class TritonRMSNormLooped(_TritonRMSNorm):
    variant = "looped"
    _kernel_name = "rms_norm_looped"


@register
class TritonRMSNormSplit(SplitRowsKernel, _TritonRMSNorm):
    _kernel_name = "rms_norm_split"
