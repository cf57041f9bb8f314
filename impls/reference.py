"""The float64 oracle: plain textbook math on the same low-precision inputs the kernel saw."""
from __future__ import annotations

import torch

from impls.base import DEFAULT_EPS, NormGrads, NormOutputs


def reference(op: str, x: torch.Tensor, weight=None, bias=None, eps: float | None = None) -> NormOutputs:
    """y, mean and rstd in float64 (y is not rounded to x's dtype); eps None is the op's default."""
    eps = DEFAULT_EPS.get(op, 0.0) if eps is None else eps
    x64 = x.double()
    if op == "layer_norm":
        mean = x64.mean(dim=-1)
        var = ((x64 - mean.unsqueeze(-1)) ** 2).mean(dim=-1)  # two-pass: no cancellation
        rstd = 1.0 / torch.sqrt(var + eps)
        y = (x64 - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    elif op == "rms_norm":
        mean = None
        rstd = 1.0 / torch.sqrt((x64 * x64).mean(dim=-1) + eps)
        y = x64 * rstd.unsqueeze(-1)
    else:
        raise ValueError(f"unknown op {op!r}")
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return NormOutputs(y=y, mean=mean, rstd=rstd)


def reference_backward(op: str, x: torch.Tensor, dy: torch.Tensor, weight=None, bias=None,
                       eps: float | None = None) -> NormGrads:
    """dx, dw and db in float64 from the analytic formulas, on the same low-precision x, dy,
    weight and bias a kernel sees (rows over the last dimension, any leading shape). With
    x^ = (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm) and g = dy * w (dy without a weight):

    - RMSNorm:   dx = rstd * (g - x^ * mean(g * x^))
    - LayerNorm: dx = rstd * (g - mean(g) - x^ * mean(g * x^))
    - dw = sum over rows of dy * x^;  db = sum over rows of dy.

    The mean term of LayerNorm's dx is the one a kernel forgets; rstd is the forward's, not
    recomputed. ``tests/test_reference.py`` holds these to torch.autograd in float64."""
    fwd = reference(op, x, None, None, eps)
    xhat = fwd.y  # no affine: the normalised row
    rstd = fwd.rstd.unsqueeze(-1)
    dy64 = dy.double()
    g = dy64 * weight.double() if weight is not None else dy64
    proj = (g * xhat).mean(dim=-1, keepdim=True)
    if op == "layer_norm":
        dx = rstd * (g - g.mean(dim=-1, keepdim=True) - xhat * proj)
    else:
        dx = rstd * (g - xhat * proj)
    lead = tuple(range(x.dim() - 1))
    dw = (dy64 * xhat).sum(dim=lead) if weight is not None else None
    db = dy64.sum(dim=lead) if bias is not None else None
    return NormGrads(dx=dx, dw=dw, db=db)


def offset_weight(weight: torch.Tensor | None, weight_offset: float) -> torch.Tensor | None:
    """The weight a fused call applies, ``weight_offset + w`` in float64 on the weight as stored
    (Gemma's 1 + w): the oracle's, and the allowance's scale."""
    return None if weight is None else weight.double() + weight_offset


def reference_fused(op: str, x: torch.Tensor, residual=None, weight=None, bias=None, eps: float | None = None,
                    weight_offset: float = 0.0, stats_on: str = "float32_sum",
                    residual_out_dtype: torch.dtype | None = None):
    """The fused ops' oracle (impls.fused), in float64 on the low-precision inputs:
    residual_out = x + residual exactly (a kernel's rounding of it is judged against this); the
    row normalised is that sum as the kernel declares it takes its statistics: rounded to float32
    ("float32_sum") or to residual_out's dtype ("rounded_sum"); the weight is ``weight_offset +
    w`` in float64 on the weight as stored. Returns FusedOutputs (y unrounded and unscaled) and
    the normalised rows (float64)."""
    from impls.fused import BASE_OP, FusedOutputs

    s = x.double()
    if residual is not None:
        s = s + residual.double()
        keep = torch.float32 if stats_on == "float32_sum" else residual_out_dtype
        src = s.to(keep).double()
    else:
        src = s
    w = offset_weight(weight, weight_offset)
    plain = reference(BASE_OP[op], src, w, bias, eps if eps is not None else DEFAULT_EPS[BASE_OP[op]])
    return FusedOutputs(y=plain.y, residual_out=s if residual is not None else None, mean=plain.mean,
                        rstd=plain.rstd), src


def reference_fused_backward(op: str, src: torch.Tensor, dy: torch.Tensor, d_residual_out=None, weight=None,
                             bias=None, eps: float | None = None, weight_offset: float = 0.0):
    """dx (= dresidual for the add ops), dw and db in float64 for rows ``src`` (what the forward
    normalised): the plain backward with the weight offset added, plus residual_out's gradient."""
    from impls.fused import BASE_OP, FusedGrads

    base = BASE_OP[op]
    w = offset_weight(weight, weight_offset)
    g = reference_backward(base, src, dy, w, bias, eps if eps is not None else DEFAULT_EPS[base])
    dx = g.dx if d_residual_out is None else g.dx + d_residual_out.double()
    return FusedGrads(dx=dx, dresidual=dx if d_residual_out is not None else None, dw=g.dw, db=g.db)
