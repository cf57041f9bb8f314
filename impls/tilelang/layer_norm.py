"""LayerNorm in TileLang: layer_norm_fwd, mean and rstd out; the row in a register fragment up to
FRAGMENT_MAX_N, beyond it two reads of x in segments merged with Chan's formula (_programs)."""
from __future__ import annotations

from impls.base import NormOutputs
from impls.registry import register
from impls.tilelang._kernel import TileLangKernel
from impls.tilelang.plan import DECODE_MAX_ROWS


@register
class TileLangLayerNormFwd(TileLangKernel):
    op = "layer_norm"
    variant = "layer_norm_fwd"
    batch_invariant = False  # few rows may take a decode plan (m_thresholds)
    pdl = True  # few rows of at most FRAGMENT_MAX_N launch with PDL where it runs (TileLangKernel.pdl_plan)
    pdl_max_rows = DECODE_MAX_ROWS
    outputs = ("y", "mean", "rstd")
    # Any N: rows beyond FRAGMENT_MAX_N take the two-pass plan (plan.make_plan); one plan per N
    # for every M there, and every reduction in a fixed order (deterministic).

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        plan = self._launch_plan(x, out.y, weight, bias)
        self._run(plan, x, weight, bias, eps, out, with_bias=True)
