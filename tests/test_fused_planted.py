"""Proof that the fused checks catch the bugs fused norms really have: each planted bug, in the
eager fused composition (impls.torch_fused) and nothing else changed, fails a case of the quick
catalogue CI runs, while the unchanged composition passes the same case."""
from __future__ import annotations

import pytest
import torch

from harness.judging.fused_cases import fused_backward_catalogue, fused_case_from_id, fused_catalogue, with_writes
from harness.judging.fused_runner import check_fused
from impls.fused import FusedParams
from impls.torch_fused import TorchAddRMSNorm, TorchRMSNormFused, normalize


class ResidualWrittenFirst(TorchAddRMSNorm):
    """In place: residual_out written into residual's storage, then the row read back as x + residual."""
    variant = "residual_written_first"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        if params.write != "in_place":
            return super()._forward(x, residual, weight, bias, eps, params, out)
        out.residual_out.copy_((x.float() + residual.float()).to(out.residual_out.dtype))
        src = x.float() + residual.float()  # residual already holds x + residual
        y, _, rstd = normalize(self.op, src, weight, bias, eps, params.weight_offset)
        out.y.copy_(y.to(out.y.dtype))
        out.rstd.copy_(rstd.view(-1))


class StatsOnRoundedSum(TorchAddRMSNorm):
    """Declares the float32 sum, normalises the sum rounded to residual_out's dtype."""
    variant = "stats_on_rounded_sum"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        rounded = (x.float() + residual.float()).to(out.residual_out.dtype)
        y, _, rstd = normalize(self.op, rounded.float(), weight, bias, eps, params.weight_offset)
        out.residual_out.copy_(rounded)
        out.y.copy_(y.to(out.y.dtype))
        out.rstd.copy_(rstd.view(-1))


class RoundedSum(TorchAddRMSNorm):
    """The eager composition declaring (and following) statistics on the rounded sum, as Liger's."""
    variant = "rounded_sum"
    stats_on = "rounded_sum"


class StatsOnFloat32Sum(RoundedSum):
    """Declares the rounded sum, normalises the float32 one."""
    variant = "stats_on_float32_sum"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        s = x.float() + residual.float()
        y, _, rstd = normalize(self.op, s, weight, bias, eps, params.weight_offset)
        out.residual_out.copy_(s.to(out.residual_out.dtype))
        out.y.copy_(y.to(out.y.dtype))
        out.rstd.copy_(rstd.view(-1))


class OffsetDropped(TorchRMSNormFused):
    variant = "offset_dropped"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        super()._forward(x, residual, weight, bias, eps, FusedParams(0.0, params.out_dtype, params.scale, params.write), out)


class OffsetAfterRounding(TorchRMSNormFused):
    """(1 + w) rounded to the weight's dtype before use: a weight |w| < 2**-8 is lost in bfloat16."""
    variant = "offset_after_rounding"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        if weight is not None and params.weight_offset:
            weight = weight + params.weight_offset  # in the weight's dtype
            params = FusedParams(0.0, params.out_dtype, params.scale, params.write)
        super()._forward(x, residual, weight, bias, eps, params, out)


class InvertedScale(TorchRMSNormFused):
    """Declares y / scale, multiplies."""
    variant = "inverted_scale"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        if params.scale is not None:
            params = FusedParams(params.weight_offset, params.out_dtype, 1.0 / params.scale, params.write)
        super()._forward(x, residual, weight, bias, eps, params, out)


class NoSaturation(TorchRMSNormFused):
    """Casts y / scale to fp8 without clamping: beyond the maximum the cast gives NaN."""
    variant = "no_saturation"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        if params.out_dtype is None:
            return super()._forward(x, residual, weight, bias, eps, params, out)
        y, _, rstd = normalize(self.op, x.float(), weight, bias, eps, params.weight_offset)
        # torch's cast saturates; a GPU's plain conversion (and Triton's interpreter) gives NaN
        # beyond the last rounding boundary: that is the cast planted here.
        v = y / params.scale
        top = torch.finfo(params.out_dtype).max
        out.y.copy_(torch.where(v.abs() > top * (1 + 2.0 ** -4), float("nan"), v).to(params.out_dtype))
        out.rstd.copy_(rstd.view(-1))


class ResidualInXDtype(TorchAddRMSNorm):
    """Declares residual_out in the residual's float32, keeps the sum in x's 16-bit dtype."""
    variant = "residual_in_x_dtype"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        super()._forward(x, residual, weight, bias, eps, params, out)
        out.residual_out.copy_(out.residual_out.to(x.dtype))


PLANTED = [
    (ResidualWrittenFirst, "add_rms_norm-bfloat16-65x769-normal-inplace"),
    (ResidualWrittenFirst, "add_rms_norm-bfloat16-17x1000-normal-inplace-adjacent"),
    (StatsOnRoundedSum, "add_rms_norm-bfloat16-17x1000-sum_rounds"),
    (StatsOnFloat32Sum, "add_rms_norm-bfloat16-17x1000-sum_rounds"),
    (OffsetDropped, "rms_norm-bfloat16-17x1000-normal-w1"),
    (OffsetAfterRounding, "rms_norm-bfloat16-17x1000-normal-w1-wsmall"),
    (InvertedScale, "rms_norm-bfloat16-17x1000-normal-e4m3s0.00390625"),
    (NoSaturation, "rms_norm-bfloat16-17x1000-normal-e4m3s0.00390625"),
    (ResidualInXDtype, "add_rms_norm-bfloat16-17x1000-normal-rfloat32"),
]


@pytest.mark.parametrize("planted, case_id", PLANTED, ids=[f"{p.variant}-{c}" for p, c in PLANTED])
def test_planted_fused_bug_is_caught(planted, case_id):
    case = fused_case_from_id(case_id)
    assert case_id in _ci_ids(planted()), f"{case_id} is not a quick-profile case of its kernel: CI would not run it"
    honest = planted.__mro__[1]()  # the same declarations, without the bug
    control = check_fused(honest, case)
    assert control.ok, f"the control fails: {control.failure_message()}"
    result = check_fused(planted(), case)
    assert not result.skipped and not result.ok, f"{planted.variant} passed {case_id}"


def _ci_ids(kernel) -> set[str]:
    """The quick cases CI runs ``kernel`` on, each in the write conventions it runs it in."""
    return {c.id for c in with_writes(fused_catalogue("quick"), kernel, "cpu")
            + with_writes(fused_backward_catalogue("quick"), kernel, "cpu", backward=True)}


def test_every_planted_case_runs_in_ci():
    assert all(c in _ci_ids(p()) for p, c in PLANTED)


class WritesX(TorchAddRMSNorm):
    """New outputs declared, x zeroed after the call."""
    variant = "writes_x"

    def _forward(self, x, residual, weight, bias, eps, params, out):
        super()._forward(x, residual, weight, bias, eps, params, out)
        x.zero_()


def test_a_write_into_x_is_found_and_the_next_kernel_gets_fresh_inputs():
    from harness.judging.fused_runner import FusedOracleCache

    case, cache = fused_case_from_id("add_rms_norm-bfloat16-17x1000-normal"), FusedOracleCache()
    assert [f.kind for f in check_fused(WritesX(), case, cache).findings] == ["input modified"]
    assert check_fused(TorchAddRMSNorm(), case, cache).ok


class InPlaceOnly(TorchAddRMSNorm):
    """The eager composition declaring one convention, in place, as FlashInfer's and vLLM's fused add."""
    variant = "in_place_only"
    writes = ("in_place",)


def test_an_in_place_only_kernel_gets_every_edge_kind_forward_and_backward():
    from harness.judging.fused_runner import check_fused_backward

    mine, full = InPlaceOnly(), TorchAddRMSNorm()
    for catalogue, backward in ((fused_catalogue("quick"), False), (fused_backward_catalogue("quick"), True)):
        cases = [c for c in with_writes(catalogue, mine, "cpu", backward) if c.out_dtype is None]  # fp8: never in place
        assert cases and {c.write for c in cases} == {"in_place"}
        kinds = {k for c in cases if c.out_dtype is None for k in (*c.tags, c.dtype)}
        given = {k for c in with_writes(catalogue, full, "cpu", backward) if c.out_dtype is None for k in (*c.tags, c.dtype)}
        assert kinds == given, given - kinds  # fp8 aside (never in place), what a new-output kernel sees
    for case in with_writes(fused_backward_catalogue("quick"), mine, "cpu", backward=True):
        result = check_fused_backward(mine, case)
        assert result.ok and not result.skipped, (case.id, result.skipped or result.failure_message())
