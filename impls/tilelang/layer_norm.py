"""LayerNorm in TileLang: layer_norm_fwd, the row in a register fragment, mean and rstd out."""
from __future__ import annotations

from impls.base import NormOutputs
from impls.registry import register
from impls.tilelang._kernel import TileLangKernel
from impls.tilelang.plan import FRAGMENT_MAX_N


@register
class TileLangLayerNormFwd(TileLangKernel):
    op = "layer_norm"
    variant = "layer_norm_fwd"
    batch_invariant = False  # few rows may take a decode plan (m_thresholds)
    outputs = ("y", "mean", "rstd")
    max_n = FRAGMENT_MAX_N
    capacity = "register"
    longer_rows_by = None  # no TileLang LayerNorm kernel loops over the row

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        plan = self._launch_plan(x, out.y, weight, bias)
        self._run(plan, x, weight, bias, eps, out, with_bias=True)
