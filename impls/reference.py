"""The float64 oracle: plain textbook math on the same low-precision inputs the kernel saw."""
from __future__ import annotations

import torch

from impls.base import NormOutputs


def reference(op: str, x: torch.Tensor, weight=None, bias=None, eps: float = 1e-6) -> NormOutputs:
    """y, mean and rstd in float64 (y is not rounded to x's dtype)."""
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
