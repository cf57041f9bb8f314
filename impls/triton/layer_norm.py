"""LayerNorm in Triton: rowwise (the whole row in one tile), looped (the row in chunks) and split
(the row over several programs)."""
from __future__ import annotations

from impls.base import NormOutputs
from impls.registry import register
from impls.triton._launch import RowwiseKernel, TritonKernel
from impls.triton._split import SplitRowsKernel
from impls.triton.settings import LaunchConfig


class _TritonLayerNorm(TritonKernel):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    _kernel_name: str

    def _forward(self, x, weight, bias, eps, out: NormOutputs, cfg: LaunchConfig | None = None) -> None:
        m, n = x.shape
        cfg = cfg or self.config(n, x.dtype, m)  # an explicit cfg: tools/triton_sweep.py
        # Absent weight or bias: x stands in as a pointer the kernel never reads.
        w = weight if weight is not None else x
        b = bias if bias is not None else x
        self.run(x, cfg, (x, w, b, out.y, out.mean, out.rstd), (m, n, x.stride(0), out.y.stride(0), eps),
                 HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None)


@register
class TritonLayerNormRowwise(RowwiseKernel, _TritonLayerNorm):
    _kernel_name = "layer_norm_rowwise"
    _row_kernel_name = "layer_norm_row"


@register
class TritonLayerNormLooped(_TritonLayerNorm):
    variant = "looped"
    _kernel_name = "layer_norm_looped"


@register
class TritonLayerNormSplit(SplitRowsKernel, _TritonLayerNorm):
    _kernel_name = "layer_norm_split"
