"""Eager PyTorch: torch.native_layer_norm and aten's fused RMSNorm, normalised to the interface."""
from __future__ import annotations

import torch

from impls.base import NormKernel, NormOutputs
from impls.registry import register


class _TorchEager(NormKernel):
    backend = "torch"
    variant = "eager"

    def note(self) -> str:
        return f"torch {torch.__version__}"

    def stat_dtype(self, dtype: torch.dtype, device: str) -> torch.dtype:
        # On the CPU, aten returns LayerNorm statistics in the input's dtype; on CUDA in float32.
        return torch.float32 if device == "cuda" else dtype


@register
class TorchRMSNorm(_TorchEager):
    op = "rms_norm"
    outputs = ("y", "rstd")
    requires_torch_ops = ("_fused_rms_norm",)  # PyTorch added it in 2025; older torch lacks it

    def stat_dtype(self, dtype, device):
        return torch.float32

    def _call(self, x, weight, bias, eps):
        return torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        y, rstd = self._call(x, weight, bias, eps)
        out.y.copy_(y)
        out.rstd.copy_(rstd.view(-1))


@register
class TorchLayerNorm(_TorchEager):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")

    def _call(self, x, weight, bias, eps):
        return torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        y, mean, rstd = self._call(x, weight, bias, eps)
        out.y.copy_(y)
        out.mean.copy_(mean.view(-1))
        out.rstd.copy_(rstd.view(-1))
