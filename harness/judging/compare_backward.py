"""Tolerance of the backward pass: dx, dw and db against the float64 oracle.

Notation per row: x^ the normalised row, g = dy * w (dy without a weight), rstd the oracle's,
cond = 1 + |mean| * rstd (1 for RMSNorm), u_c = 2^-24 (float32 arithmetic), u_s the unit
roundoff of the precision the kernel declares its statistics in (``NormKernel.stat_dtype``).
docs/checks.md, *Backward tolerance*, derives each bound; in short:

- **dx** = rstd * (g - mean(g) - x^ * mean(g * x^)) (no mean(g) for RMSNorm). Each term is at most
  scale_i = rstd * (|g_i| + rms(g) * (1 + |x^_i|)) (|mean g| <= rms g; |mean g x^| <= rms g, since
  rms x^ <= 1), and so is |dx_i|. A float32 kernel errs in every term by a few u_c relative,
  in the row sums by about u_c * rms(g) whatever N (the partial sums of terms of either sign grow
  like sqrt(k)), and through its saved statistics: x^ errs by u_s * cond * (1 + |x^|), rstd by
  u_s * cond relative. So ``|dx - ref| <= DX_ULPS * ulp(ref) + DX_K * (u_c + u_s * cond) * scale_i``.
- **dw** = sum over M rows of t = dy * x^, **db** = sum of t = dy: sums whose allowance grows with
  M. Each rounding of a float32 running sum errs by at most u_c times the partial sum; partial
  sums of terms of either sign grow like sqrt(k) * rms(t), so M of them err by about
  u_c * M * rms(t) / sqrt(6) sequentially (atomics, one loop over rows) and less in blocks or a
  tree. Allowed: ``ACC_LAMBDA * u_c * sqrt(M) * ||t_j||_2`` (= ACC_LAMBDA * u_c * M * rms(t_j)), plus
  each term's own error from x^ (independent per row, so summed in L2:
  ``DX_K * ||(u_c + u_s * cond_r) * |dy_rj| * (1 + |x^_rj|)||_2``), plus PARAM_ULPS ulps of the
  parameter dtype for the final rounding.
- A row left out of dw or db moves column j by |t_rj| ~ rms(t_j), while the allowance is
  ACC_LAMBDA * u_c * M * rms(t_j) = 0.03 * rms(t_j) at M = 65537: every catalogue M catches one
  row dropped (tests/test_compare.py proves it, and that honest kernels of several precisions
  pass). In a 16-bit dw, one ulp of |dw| ~ sqrt(M) * rms(t) is itself a row's size from M ~ 2^16:
  the catalogue's largest M is float32 only.
"""
from __future__ import annotations

import math

import torch

from harness.judging.compare import MANTISSA_BITS, ErrorStats, compare, distance_tensor, ulp
from impls.base import NormGrads, NormOutputs

U32 = 2.0**-24  # unit roundoff of float32 arithmetic
UNIT_ROUNDOFF = {torch.float32: U32, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float64: 2.0**-53}
DX_ULPS = 1.0  # the rounding of dx to its dtype (a correctly rounded result lands within 0.5)
DX_K = 32.0  # units of (u_c + u_s * cond) * scale_i: the few roundings per term and the row sums
PARAM_ULPS = 1.0  # the rounding of dw and db to the parameter dtype
ACC_LAMBDA = 8.0  # sqrt(M) * ||t||_2 units of u_c: the accumulation over rows, with margin


class BackwardReference:
    """What the backward allowances need from the oracle for one case, computed once: the
    reference gradients, and per row x^, rstd and cond (float64)."""

    def __init__(self, op: str, x, dy, weight, bias, grads: NormGrads, fwd: NormOutputs):
        self.op, self.grads = op, grads
        n = x.shape[-1]
        x2, dy2 = x.reshape(-1, n).double(), dy.reshape(-1, n).double()
        rstd = fwd.rstd.reshape(-1, 1).double()
        mean = fwd.mean.reshape(-1, 1).double() if op == "layer_norm" else torch.zeros_like(rstd)
        self.rows = x2.shape[0]
        self.xhat = torch.nan_to_num((x2 - mean) * rstd, nan=0.0, posinf=0.0, neginf=0.0)
        self.rstd = torch.nan_to_num(rstd, nan=0.0, posinf=0.0)
        self.cond = torch.nan_to_num(1.0 + mean.abs() * rstd, nan=1.0, posinf=1.0) if op == "layer_norm" \
            else torch.ones_like(rstd)
        self.dy = torch.nan_to_num(dy2, nan=0.0, posinf=0.0, neginf=0.0)
        self.g = self.dy * weight.double() if weight is not None else self.dy
        self.shape = x.shape
        self.floors: dict = {}  # stat dtype -> floors_of's answer, computed once per case


def _unit(stat_dtype: torch.dtype) -> float:
    return UNIT_ROUNDOFF.get(stat_dtype, U32)


def dx_floor(ref: BackwardReference, stat_dtype: torch.dtype) -> torch.Tensor:
    """The part of dx's allowance beyond its ulps (float64, x's shape)."""
    rms_g = ref.g.pow(2).mean(dim=-1, keepdim=True).sqrt()
    scale = ref.rstd * (ref.g.abs() + rms_g * (1.0 + ref.xhat.abs()))
    return (DX_K * (U32 + _unit(stat_dtype) * ref.cond) * scale).reshape(ref.shape)


def sum_floor(ref: BackwardReference, name: str, stat_dtype: torch.dtype) -> torch.Tensor:
    """The part of dw's ("dw") or db's ("db") allowance beyond its ulps (float64, (N,))."""
    t = ref.dy * ref.xhat if name == "dw" else ref.dy
    allowed = ACC_LAMBDA * U32 * math.sqrt(max(ref.rows, 1)) * t.pow(2).sum(dim=0).sqrt()
    if name == "dw":  # each term's own error, through x^ (independent per row: summed in L2)
        term = (U32 + _unit(stat_dtype) * ref.cond) * ref.dy.abs() * (1.0 + ref.xhat.abs())
        allowed = allowed + DX_K * term.pow(2).sum(dim=0).sqrt()
    return allowed


def floors_of(ref: BackwardReference, stat_dtype: torch.dtype) -> dict[str, tuple[float, torch.Tensor]]:
    """gradient -> (ulps of its dtype, floor) for every gradient the oracle has."""
    if stat_dtype not in ref.floors:
        out = {"dx": (DX_ULPS, dx_floor(ref, stat_dtype))}
        for name in ("dw", "db"):
            if getattr(ref.grads, name) is not None:
                out[name] = (PARAM_ULPS, sum_floor(ref, name, stat_dtype))
        ref.floors[stat_dtype] = out
    return ref.floors[stat_dtype]


def allowances_of(ref: BackwardReference, dtype: torch.dtype, stat_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """gradient -> the error allowed in each of its elements (float64)."""
    return {name: ulps * ulp(getattr(ref.grads, name), dtype) + floor
            for name, (ulps, floor) in floors_of(ref, stat_dtype).items()}


def compare_grads(grads: NormGrads, ref: BackwardReference, x_dtype: torch.dtype,
                  stat_dtype: torch.dtype) -> list[ErrorStats]:
    """dx, and dw and db where the oracle has them, each against the oracle with its allowance.
    A gradient the oracle has and the kernel did not write is a mismatch of every element."""
    stats = []
    for name, (ulps, floor) in floors_of(ref, stat_dtype).items():
        want, got = in_range(getattr(ref.grads, name), x_dtype), getattr(grads, name)
        if got is None:
            got = torch.full_like(want, math.nan)
        stats.append(compare(name, got, want, x_dtype, floor, ulps))
    return stats


def in_range(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The reference as the dtype can hold it: beyond its largest finite value (by half an ulp),
    the correctly rounded result is an infinity, which the kernel must then give (a 16-bit dx of
    a row with a tiny spread and a large dy overflows in any kernel)."""
    fi = torch.finfo(dtype)
    limit = fi.max * (1 + 2.0 ** -(MANTISSA_BITS[dtype] + 1))
    return torch.where(ref.abs() >= limit, ref.sign() * math.inf, ref)


def agreement(ref: BackwardReference, x_dtype: torch.dtype, a: tuple, b: tuple) -> tuple[float, str]:
    """How far two kernels' gradients on the same case are apart in units of the allowed error
    (the larger of the two kernels' allowances), and the gradient furthest apart. ``a`` and
    ``b``: (NormGrads, stat dtype)."""
    return agreements(ref, x_dtype, a, {"b": b})["b"]


def agreements(ref: BackwardReference, x_dtype: torch.dtype, mine: tuple, others: dict,
               cache: dict | None = None) -> dict:
    """``agreement`` of ``mine`` with each of ``others`` (name -> (NormGrads, stat dtype)), as
    name -> (difference, gradient furthest apart), read back from the GPU at once. ``cache``
    keeps the case's allowances per statistics dtype between calls on the same case."""
    cache = {} if cache is None else cache

    def allowed(stat_dtype):
        if stat_dtype not in cache:
            cache[stat_dtype] = allowances_of(ref, x_dtype, stat_dtype)
        return cache[stat_dtype]

    ga, sa = mine
    parts, labels = [], []
    for other, (gb, sb) in others.items():
        wa, wb = allowed(sa), allowed(sb)
        labels.append((other, "dx", None))  # each pair starts at (0, "dx"), as with no gradient compared
        for name in wa:
            ta, tb = getattr(ga, name), getattr(gb, name)
            if ta is None or tb is None:
                continue
            parts.append(distance_tensor(ta.reshape(-1), tb.reshape(-1), torch.maximum(wa[name], wb[name]).reshape(-1)))
            labels.append((other, name, len(parts) - 1))
    values = torch.stack(parts).tolist() if parts else []
    found: dict = {}
    for other, name, k in labels:
        d = 0.0 if k is None else values[k]
        found[other] = max(found.get(other, (d, name)), (d, name))
    return found
