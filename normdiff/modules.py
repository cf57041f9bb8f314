"""``nn.Module``s over the project's kernels (forward and backward), drop-in for torch's
``nn.RMSNorm`` / ``nn.LayerNorm`` over the last dimension; they call the custom ops of
normdiff.ops, so they also run inside ``torch.compile``. FusedAddRMSNorm / FusedAddLayerNorm are
the modules with their parameters that take ``(x, residual)`` and call the fused ops
(normdiff.fused_ops)."""
from __future__ import annotations

import torch
from torch import nn

from impls.base import DEFAULT_EPS
from normdiff import fused_ops, ops


def _one_dim(normalized_shape) -> int:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"normdiff normalises the last dimension only; got normalized_shape={shape}")
    return shape[0]


class RMSNorm(nn.Module):
    def __init__(self, normalized_shape, eps: float = DEFAULT_EPS["rms_norm"], elementwise_affine: bool = True,
                 kernel: str = "auto", device=None, dtype=None):
        super().__init__()
        self.n, self.eps, self.kernel = _one_dim(normalized_shape), eps, kernel
        self.weight = nn.Parameter(torch.ones(self.n, device=device, dtype=dtype)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, self.kernel)

    def extra_repr(self) -> str:
        return f"{self.n}, eps={self.eps}, elementwise_affine={self.weight is not None}, kernel={self.kernel!r}"


class LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps: float = DEFAULT_EPS["layer_norm"], elementwise_affine: bool = True, bias: bool = True,
                 kernel: str = "auto", device=None, dtype=None):
        super().__init__()
        self.n, self.eps, self.kernel = _one_dim(normalized_shape), eps, kernel
        kw = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.ones(self.n, **kw)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(self.n, **kw)) if elementwise_affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps, self.kernel)

    def extra_repr(self) -> str:
        return f"{self.n}, eps={self.eps}, elementwise_affine={self.weight is not None}, kernel={self.kernel!r}"


class FusedAddRMSNorm(RMSNorm):
    """``forward(x, residual)`` -> (y, residual_out): RMSNorm of x + residual (normdiff.add_rms_norm),
    with weight ``weight_offset + w`` (1: Gemma's, whose w starts at zeros); ``write="in_place"``
    and the fp8 output (``out_dtype``, ``scale``) per call, without autograd."""

    def __init__(self, normalized_shape, eps: float = DEFAULT_EPS["rms_norm"], elementwise_affine: bool = True,
                 weight_offset: float = 0.0, kernel: str = "auto", device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, kernel, device, dtype)
        self.weight_offset = float(weight_offset)
        if self.weight is not None and self.weight_offset:
            with torch.no_grad():  # the effective weight starts at ones, as without an offset
                self.weight.sub_(self.weight_offset)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, *, write: str = "new", out_dtype=None, scale=None):
        return fused_ops.add_rms_norm(x, residual, self.weight, self.eps, weight_offset=self.weight_offset,
                                      out_dtype=out_dtype, scale=scale, write=write, kernel=self.kernel)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, weight_offset={self.weight_offset:g}"


class FusedAddLayerNorm(LayerNorm):
    """``forward(x, residual)`` -> (y, residual_out): LayerNorm of x + residual
    (normdiff.add_layer_norm); ``write="in_place"`` per call, without autograd."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor, *, write: str = "new"):
        return fused_ops.add_layer_norm(x, residual, self.weight, self.bias, self.eps, write=write, kernel=self.kernel)
