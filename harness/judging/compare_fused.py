"""Tolerance of the fused family's outputs (impls.fused) against the float64 oracle.

- **y** in x's dtype, **mean**, **rstd**: the plain norms' policy (harness.judging.compare), on the
  row the kernel declares it normalises and with the weight the offset makes (w + offset).
- **residual_out** = x + residual: within one ulp of residual_out's dtype of the exact sum
  (faithful rounding: a float32 sum rounded again to 16 bits may round a tie the other way). A
  sum kept in x's 16-bit dtype where float32 is declared errs by thousands of float32 ulps.
- **fp8 y**: the oracle is y / scale, saturated to the format's maximum. Each output must be one
  of the two fp8 values next to it, and the nearest (ties to even) wherever the oracle is more
  than ``FP8_MIDPOINT_DELTA`` of the gap between them, plus the float32 floor of the plain y check
  (scaled by the row's conditioning: LayerNorm's constant rows, a bias cancelling x^ * w), from
  their midpoint. docs/checks.md, *fp8 output*, derives the bound: a float32 kernel's own error,
  not the rounding rule of Triton's interpreter (ties away from zero), decides near a midpoint. NaN becomes what the kernel
  declares (``fp8_nan``); an infinity or a NaN where the oracle is finite fails.
"""
from __future__ import annotations

import math

import torch

from harness.judging.compare import Y_FLOOR, ErrorStats, compare, compare_outputs, row_scale
from impls.reference import offset_weight
from impls.base import NormOutputs
from impls.fused import fp8_max

# Near a midpoint (within this fraction of the gap between its two fp8 neighbours) either
# neighbour passes. docs/checks.md derives it: 2**-10 of a gap is 2**-14 relative for e4m3
# (gaps of 2**-4 to 2**-3 relative), above a float32 norm's error (a few 2**-24 * the row's
# accumulation) by a wide margin, far below the half-ulp of a 16-bit intermediate (2**-9).
FP8_MIDPOINT_DELTA = 2.0**-10
RESIDUAL_ULPS = 1.0


def residual_out_stats(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> ErrorStats:
    return compare("residual_out", got, exact, dtype, 0.0, RESIDUAL_ULPS)


def _from_bits(bits: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    return (bits & 0xFF).to(torch.uint8).view(fmt).double()


def fp8_neighbours(v: torch.Tensor, fmt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lo, hi, nearest) in float64 for float64 ``v`` saturated to the format's range: the two fp8
    values around it (equal where v is one) and the one rounding to nearest even gives."""
    top = fp8_max(fmt)
    c = v.clamp(-top, top)
    nearest = c.float().to(fmt)  # float64 -> float32 first: a double rounding 2**-24 from a midpoint, within the delta
    r = nearest.double()
    bits = nearest.view(torch.uint8).to(torch.int16)
    negative, magnitude = bits >= 0x80, bits & 0x7F
    up = torch.where(~negative, bits + 1, torch.where(magnitude == 0, 1, bits - 1))  # toward +inf
    down = torch.where(negative, bits + 1, torch.where(magnitude == 0, 0x81, bits - 1))  # toward -inf
    lo = torch.where(r <= c, r, _from_bits(down, fmt))
    hi = torch.where(r >= c, r, _from_bits(up, fmt))
    return lo, hi, r


def fp8_stats(got: torch.Tensor, y64: torch.Tensor, scale: float, fmt: torch.dtype, nan_rule: str,
              delta: float = FP8_MIDPOINT_DELTA, y_floor: torch.Tensor | float = 0.0) -> ErrorStats:
    """An fp8 y against the oracle's unscaled float64 y (see the module's rule). ``y_floor``: the
    absolute error a correct float32 kernel may make in y before its cast (the plain check's
    float32 floor times the row's conditioning), which widens the band around a midpoint."""
    v = y64.double() / scale
    o = got.double()
    lo, hi, nearest = fp8_neighbours(v, fmt)
    top = fp8_max(fmt)
    c = v.clamp(-top, top)
    gap = hi - lo
    near_mid = (c - (lo + hi) / 2).abs() <= delta * gap + y_floor / scale
    ok = (o == nearest) | (near_mid & ((o == lo) | (o == hi)))
    ref_nan = torch.isnan(v)
    want_nan = {"nan": torch.isnan(o), "max": o == top, "-max": o == -top}[nan_rule]
    ok = torch.where(ref_nan, want_nan, ok & torch.isfinite(o))
    # Error in units of the gap (one fp8 step); a NaN or an infinity counts as infinitely far.
    step = torch.where(gap > 0, gap, torch.ones_like(gap))
    err = torch.where(ref_nan | ~torch.isfinite(o), torch.where(ok, 0.0, math.inf), (o - c).abs() / step)
    ratio = torch.where(ok, torch.zeros_like(err), 1.0 + err)
    bad = ~ok
    finite = torch.isfinite(c) & torch.isfinite(o)
    flat = int(torch.argmax(ratio.reshape(-1))) if o.numel() else 0
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), o.shape)) if o.numel() else None
    diff = torch.where(finite, (o - c), torch.zeros_like(o))
    ref_l2 = float(torch.where(finite, c, torch.zeros_like(c)).norm())
    err_l2 = float(diff.norm())
    return ErrorStats(
        output="y", max_abs=float(diff.abs().max()) if o.numel() else 0.0,
        max_ulp=float(torch.where(finite, err, torch.zeros_like(err)).max()) if o.numel() else 0.0,
        rel_l2=err_l2 / ref_l2 if ref_l2 else 0.0, worst_ratio=float(ratio.reshape(-1)[flat]) if o.numel() else 0.0,
        mismatched=int(bad.sum()), numel=o.numel(), worst_index=idx,
        worst_out=float(o.reshape(-1)[flat]) if o.numel() else None,
        worst_ref=float(v.reshape(-1)[flat]) if o.numel() else None, err_l2=err_l2, ref_l2=ref_l2)


def compare_fused(kernel, case, got, ref, src: torch.Tensor, weight, stat_dtype: torch.dtype) -> list[ErrorStats]:
    """Every output of a fused kernel against the oracle (``ref``: impls.reference.reference_fused's
    outputs; ``src`` the row it normalised)."""
    from impls.fused import BASE_OP

    base = BASE_OP[case.op]
    w_eff = offset_weight(weight, case.weight_offset)
    out_fmt = case.out_torch_dtype
    y_for_plain = ref.y if out_fmt is not None else got.y  # an fp8 y is judged on its own below
    errors = compare_outputs(base, NormOutputs(y_for_plain, got.mean, got.rstd), NormOutputs(ref.y, ref.mean, ref.rstd),
                             case.torch_dtype, stat_dtype, w_eff)
    if out_fmt is not None:
        floor = Y_FLOOR[torch.float32] * row_scale(base, ref.mean, ref.rstd, w_eff)
        errors[0] = fp8_stats(got.y, ref.y, case.scale, out_fmt, kernel.fp8_nan, y_floor=floor)
    if ref.residual_out is not None:
        errors.append(residual_out_stats(got.residual_out, ref.residual_out, got.residual_out.dtype))
    return errors

