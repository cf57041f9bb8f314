"""Kernels with planted bugs, each one a bug that shipped in some public normalization kernel.

They compute in float32 with plain PyTorch (fast on the CPU) and differ from ``Correct`` only in
the planted bug, so a test that catches one of them catches the bug, not an artefact.
"""
from __future__ import annotations

import torch

from impls.base import NormKernel, NormOutputs

ROWS_PER_BLOCK = 4
PAD_TO = 128


class Correct(NormKernel):
    """float32 two-pass normalisation: the control that must pass everything."""

    backend = "planted"
    variant = "correct"
    devices = ("cpu", "cuda")

    def __init__(self, op: str):
        self.op = op
        self.outputs = ("y", "mean", "rstd") if op == "layer_norm" else ("y", "rstd")

    # The steps a bug can replace.
    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, variance) per row for layer_norm; (0, mean square) for rms_norm."""
        if self.op == "rms_norm":
            return x.new_zeros(x.shape[0]), (x * x).mean(-1)
        mean = x.mean(-1)
        return mean, ((x - mean[:, None]) ** 2).mean(-1)

    def inverse_std(self, var: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.rsqrt(var + eps)

    def affine(self, y, weight, bias):
        if weight is not None:
            y = y * weight.float()
        if bias is not None:
            y = y + bias.float()
        return y

    def write(self, out: NormOutputs, y, mean, rstd) -> None:
        out.y.copy_(y)
        if out.mean is not None:
            out.mean.copy_(mean)
        out.rstd.copy_(rstd)

    def _forward(self, x, weight, bias, eps, out):
        xf = x.float()
        mean, var = self.statistics(xf)
        rstd = self.inverse_std(var, eps)
        y = self.affine((xf - mean[:, None]) * rstd[:, None], weight, bias)
        self.write(out, y, mean, rstd)


class EpsOutsideSqrt(Correct):
    variant = "eps_outside_sqrt"

    def inverse_std(self, var, eps):
        return 1.0 / (torch.sqrt(var) + eps)


class DividesByPaddedN(Correct):
    variant = "divides_by_padded_n"

    def statistics(self, x):
        n_padded = -(-x.shape[1] // PAD_TO) * PAD_TO
        padded = torch.nn.functional.pad(x, (0, n_padded - x.shape[1]))
        if self.op == "rms_norm":
            return x.new_zeros(x.shape[0]), (padded * padded).sum(-1) / n_padded
        mean = padded.sum(-1) / n_padded
        return mean, ((x - mean[:, None]) ** 2).sum(-1) / n_padded


class OnePassVariance(Correct):
    """E[x^2] - E[x]^2 in float32: cancels when the mean is large against the spread."""

    variant = "one_pass_variance"

    def statistics(self, x):
        mean = x.mean(-1)
        return mean, ((x * x).mean(-1) - mean * mean).clamp(min=0)


class ShiftsByFirstElement(Correct):
    """Centres on k = x[row, 0] before the statistics, a cheap guard against large means (this
    project's Triton rowwise LayerNorm did it until the catalogue's outlier_first rows): x - k
    rounds at k's magnitude, so a row whose first element is an outlier loses its spread."""

    variant = "shifts_by_first_element"

    def _forward(self, x, weight, bias, eps, out):
        xf = x.float()
        k = xf[:, :1]
        xs = xf - k
        mean_s = xs.mean(-1)
        d = xs - mean_s[:, None]
        rstd = self.inverse_std((d * d).mean(-1), eps)
        self.write(out, self.affine(d * rstd[:, None], weight, bias), k[:, 0] + mean_s, rstd)


class ClampDropsNan(Correct):
    """Clamps the variance at zero with an IEEE maxNum (CUDA fmaxf; tl.maximum on the GPU),
    which returns the number when the other operand is NaN: a NaN row reports rstd =
    1/sqrt(eps) instead of NaN (this project's Triton looped LayerNorm, caught on the H200)."""

    variant = "clamp_drops_nan"

    def inverse_std(self, var, eps):
        return torch.rsqrt(torch.fmax(var, torch.zeros_like(var)) + eps)


class SkipsTailRows(Correct):
    """Launches M // ROWS_PER_BLOCK blocks instead of ceil(M / ROWS_PER_BLOCK)."""

    variant = "skips_tail_rows"

    def write(self, out, y, mean, rstd):
        m = (y.shape[0] // ROWS_PER_BLOCK) * ROWS_PER_BLOCK
        out.y[:m].copy_(y[:m])
        if out.mean is not None:
            out.mean[:m].copy_(mean[:m])
        out.rstd[:m].copy_(rstd[:m])


class WritesPastRowEnd(Correct):
    """Stores BLOCK = N + 1 lanes per row with the mask off by one."""

    variant = "writes_past_row_end"

    def write(self, out, y, mean, rstd):
        super().write(out, y, mean, rstd)
        m, n = out.y.shape
        wide = out.y.as_strided((m, n + 1), (out.y.stride(0), 1))
        wide[:, n] = y[:, -1].to(out.y.dtype)


class RstdAsStd(Correct):
    variant = "rstd_as_std"

    def write(self, out, y, mean, rstd):
        super().write(out, y, mean, 1.0 / rstd)


class IgnoresWeight(Correct):
    variant = "ignores_weight"

    def affine(self, y, weight, bias):
        return super().affine(y, None, bias)


class IgnoresBias(Correct):
    variant = "ignores_bias"

    def affine(self, y, weight, bias):
        return super().affine(y, weight, None)


def bf16_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums with every partial sum rounded to bfloat16 (a pairwise tree, as a GPU reduces)."""
    acc = x.to(torch.bfloat16)
    while acc.shape[1] > 1:
        if acc.shape[1] % 2:
            acc = torch.nn.functional.pad(acc, (0, 1))
        acc = acc[:, 0::2] + acc[:, 1::2]  # bfloat16 + bfloat16 rounds to bfloat16
    return acc[:, 0].float()


class AccumulatesInBf16(Correct):
    variant = "accumulates_in_bf16"

    def statistics(self, x):
        n = x.shape[1]
        if self.op == "rms_norm":
            return x.new_zeros(x.shape[0]), bf16_sum(x * x) / n
        mean = bf16_sum(x) / n
        return mean, bf16_sum((x - mean[:, None]) ** 2) / n


class LeaksNanAcrossRows(Correct):
    """Pre-scales by the largest |x| of a 4-row tile (for overflow safety) instead of each
    row's own: mathematically the same result, but a NaN in one row spreads to its tile."""

    variant = "leaks_nan_across_rows"

    def _forward(self, x, weight, bias, eps, out):
        xf = x.float()
        m = xf.shape[0]
        tiles = -(-m // ROWS_PER_BLOCK)
        padded = torch.nn.functional.pad(xf, (0, 0, 0, tiles * ROWS_PER_BLOCK - m))
        tile_max = padded.view(tiles, -1).abs().amax(-1)  # propagates NaN
        s = tile_max.repeat_interleave(ROWS_PER_BLOCK)[:m].clamp(min=1e-30)
        xs = xf / s[:, None]
        mean_s, var_s = self.statistics(xs)
        rstd_s = torch.rsqrt(var_s + eps / (s * s))
        y = self.affine((xs - mean_s[:, None]) * rstd_s[:, None], weight, bias)
        self.write(out, y, mean_s * s, rstd_s / s)


class ModifiesInput(Correct):
    """Uses x as scratch space for the normalised row."""

    variant = "modifies_input"

    def _forward(self, x, weight, bias, eps, out):
        super()._forward(x, weight, bias, eps, out)
        x.copy_(out.y)


PLANTED = {
    cls.variant: cls
    for cls in (
        EpsOutsideSqrt, DividesByPaddedN, OnePassVariance, SkipsTailRows, WritesPastRowEnd,
        RstdAsStd, IgnoresWeight, IgnoresBias, AccumulatesInBf16, LeaksNanAcrossRows, ModifiesInput,
        ShiftsByFirstElement, ClampDropsNan,
    )
}


# -- bugs only the bitwise properties see (harness.judging.properties): within tolerance of the oracle --
class ReductionOrderPerCall(Correct):
    """The row's sums taken in an order that changes from call to call, as partial sums combined
    by atomics are: every call is within tolerance, but two calls differ in the last bits."""

    variant = "reduction_order_per_call"
    calls = 0

    def statistics(self, x):
        type(self).calls += 1
        order = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(self.calls))
        return super().statistics(x[:, order.to(x.device)])


class ReductionOrderByM(Correct):
    """A dispatch by row count: beyond 64 rows the sums run over the row in reverse, as another
    plan would order them; a row's last bits then depend on how many rows share the call."""

    variant = "reduction_order_by_m"

    def statistics(self, x):
        return super().statistics(x.flip(1) if x.shape[0] > 64 else x)


# The bugs above, by the check that alone must catch them.
PROPERTY_PLANTED = {"test_deterministic": ReductionOrderPerCall, "test_batch_invariant": ReductionOrderByM}



# -- backward bugs (harness/test_backward.py must catch each; CorrectBackward passes) ------------
class CorrectBackward(Correct):
    """Correct's forward and a float32 backward from the saved mean and rstd, with dw and db
    reduced as a GPU does: partial sums per block of ROWS_PER_BLOCK rows, then a sum of those."""

    variant = "correct_backward"

    def normalised(self, x, saved):
        mean = saved.mean[:, None] if saved.mean is not None else 0.0
        return (x.float() - mean) * saved.rstd[:, None]

    def row_means(self, g, xhat):
        """(mean of g, mean of g * x^) per row: the row dot products of dx (mean g: LayerNorm's)."""
        c1 = g.mean(-1, keepdim=True) if self.op == "layer_norm" else torch.zeros_like(g[:, :1])
        return c1, (g * xhat).mean(-1, keepdim=True)

    def reduce_rows(self, t):
        m = t.shape[0]
        blocks = -(-m // ROWS_PER_BLOCK)
        padded = torch.nn.functional.pad(t, (0, 0, 0, blocks * ROWS_PER_BLOCK - m))
        return padded.view(blocks, ROWS_PER_BLOCK, -1).sum(1).sum(0)

    def reduce_dw(self, t):
        return self.reduce_rows(t)

    def reduce_db(self, t):
        return self.reduce_rows(t)

    def _backward(self, x, weight, bias, dy, saved, eps, out):
        xhat, dyf = self.normalised(x, saved), dy.float()
        g = dyf * weight.float() if weight is not None else dyf
        c1, c2 = self.row_means(g, xhat)
        out.dx.copy_(saved.rstd[:, None] * (g - c1 - xhat * c2))
        if out.dw is not None:
            out.dw.copy_(self.reduce_dw(dyf * xhat))
        if out.db is not None:
            out.db.copy_(self.reduce_db(dyf))


class DwDropsLastPartialBlock(CorrectBackward):
    """Launches M // ROWS_PER_BLOCK row blocks for dw's partial sums: the tail rows never count."""

    variant = "dw_drops_last_partial_block"

    def reduce_dw(self, t):
        full = (t.shape[0] // ROWS_PER_BLOCK) * ROWS_PER_BLOCK
        return self.reduce_rows(t[:full]) if full else torch.zeros_like(t[0])


class DxMissingMeanTerm(CorrectBackward):
    """LayerNorm's dx without its - mean(g) term (the RMSNorm formula applied to LayerNorm)."""

    variant = "dx_missing_mean_term"

    def row_means(self, g, xhat):
        return torch.zeros_like(g[:, :1]), super().row_means(g, xhat)[1]


class DwAccumulatedIn16Bits(CorrectBackward):
    """dw's sum over rows with every partial sum rounded to bfloat16 (a pairwise tree)."""

    variant = "dw_accumulated_in_16_bits"

    def reduce_dw(self, t):
        return bf16_sum(t.t().contiguous())


class DxDividesByPaddedN(CorrectBackward):
    """dx's row dot products summed over the block of PAD_TO lanes (zeros past N, as masked
    loads give) but divided by the padded length instead of N."""

    variant = "dx_divides_by_padded_n"

    def row_means(self, g, xhat):
        n = g.shape[1]
        n_padded = -(-n // PAD_TO) * PAD_TO
        c1, c2 = super().row_means(g, xhat)
        return c1 * n / n_padded, c2 * n / n_padded


class DxDotReadsPastRow(CorrectBackward):
    """dx's row dot products over PAD_TO-lane blocks whose lanes past N are not masked: they hold
    the next row's first elements (the last row's wrap to the first), which enter the sums."""

    variant = "dx_dot_reads_past_row"

    def row_means(self, g, xhat):
        n = g.shape[1]
        extra = -(-n // PAD_TO) * PAD_TO - n
        if extra == 0:
            return super().row_means(g, xhat)
        spill = lambda t: torch.cat([t, t.roll(-1, 0)[:, :extra].expand(-1, extra) if extra <= n  # noqa: E731
                                     else t.roll(-1, 0).repeat(1, -(-extra // n))[:, :extra]], 1)
        gp, xp = spill(g), spill(xhat)
        c1 = gp.sum(-1, keepdim=True) / n if self.op == "layer_norm" else torch.zeros_like(g[:, :1])
        return c1, (gp * xp).sum(-1, keepdim=True) / n


class DbScaledByOneOverM(CorrectBackward):
    """db as the mean of dy over rows instead of its sum."""

    variant = "db_scaled_by_one_over_m"

    def reduce_db(self, t):
        return self.reduce_rows(t) / t.shape[0]


BACKWARD_PLANTED = {
    cls.variant: cls
    for cls in (DwDropsLastPartialBlock, DxMissingMeanTerm, DwAccumulatedIn16Bits, DxDividesByPaddedN,
                DxDotReadsPastRow, DbScaledByOneOverM)
}


class DwOrderPerCall(CorrectBackward):
    """dw's rows summed in an order that changes from call to call (partial sums combined by
    atomics): within tolerance every time, but two calls differ in the last bits. Only the
    backward determinism check sees it."""

    variant = "dw_order_per_call"
    calls = 0

    def reduce_dw(self, t):
        type(self).calls += 1
        order = torch.randperm(t.shape[0], generator=torch.Generator().manual_seed(self.calls))
        return _sequential_sum(t[order.to(t.device)])


def _sequential_sum(t):
    acc = torch.zeros_like(t[0])
    for row in t:
        acc = acc + row
    return acc


class DxOrderByM(CorrectBackward):
    """dx's row dot products summed over the row in reverse beyond 64 rows, as another plan would
    order them: a row's dx bits then depend on how many rows share the call. Within tolerance;
    only the backward batch-invariance check sees it."""

    variant = "dx_order_by_m"

    def row_means(self, g, xhat):
        if g.shape[0] <= 64:
            return super().row_means(g, xhat)
        c1, c2 = super().row_means(g.flip(1), xhat.flip(1))
        return c1, c2
