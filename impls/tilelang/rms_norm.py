"""RMSNorm in TileLang: naive_row_per_block, fragment and splitk (see _programs for each)."""
from __future__ import annotations

from impls.base import NormOutputs
from impls.registry import register
from impls.tilelang._kernel import TileLangKernel
from impls.tilelang.plan import DECODE_MAX_ROWS, FRAGMENT_MAX_N


class _TileLangRMSNorm(TileLangKernel):
    op = "rms_norm"
    outputs = ("y", "rstd")

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        plan = self._launch_plan(x, out.y, weight)
        self._run(plan, x, weight, None, eps, out, with_bias=False)


@register
class TileLangRMSNormNaive(_TileLangRMSNorm):
    """Two reads of x, partial sums in shared memory; loops over the row, so any N."""

    variant = "naive_row_per_block"
    batch_invariant = True  # one plan for every M, one row per block


@register
class TileLangRMSNormFragment(_TileLangRMSNorm):
    """One read of x; the whole row in a register fragment."""

    variant = "fragment"
    batch_invariant = False  # few rows may take a decode plan (m_thresholds)
    pdl = True  # few rows launch with PDL where it runs (TileLangKernel.pdl_plan)
    pdl_max_rows = DECODE_MAX_ROWS
    max_n = FRAGMENT_MAX_N
    capacity = "register"
    longer_rows_by = "tilelang.splitk"


@register
class TileLangRMSNormSplitK(_TileLangRMSNorm):
    """Two reads of x in blk_k segments, the second pass in reverse; any N."""

    variant = "splitk"
    batch_invariant = True  # one plan for every M, one row per block
