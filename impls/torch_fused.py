"""Eager PyTorch's fused norms: the reference composition every fused kernel is measured beside,
for every fused op, write convention, weight offset and fp8 output (impls.fused). Computed in
float32: x + residual, the statistics on that sum, y, then the fp8 scale and saturation."""
from __future__ import annotations

import torch

from impls.fused import BASE_OP, FP8_DTYPES, FusedGrads, FusedNormKernel, FusedOutputs, FusedParams, fp8_max
from impls.registry import register
from impls.repro_calls import through_normdiff


def quantize_fp8(y: torch.Tensor, params: FusedParams, convention: str = "divide") -> torch.Tensor:
    """y (float32) to the fp8 output: scaled, clamped to the format's maximum (a cast does not
    saturate: beyond it gives NaN or inf), rounded to nearest even by the cast. NaN stays NaN."""
    scaled = y / params.scale if convention == "divide" else y * params.scale
    top = fp8_max(params.out_dtype)
    return scaled.clamp(-top, top).to(params.out_dtype)


def normalize(op: str, src: torch.Tensor, weight, bias, eps: float, weight_offset: float):
    """y, mean and rstd (float32) of rows ``src`` (float32)."""
    if BASE_OP[op] == "layer_norm":
        # Centred twice, as the project's kernels: a float32 mean of equal values is not exact, and
        # on a row of one value its error would come back times 1/sqrt(eps) (an fp8 y two steps off).
        mean = src.mean(dim=-1, keepdim=True)
        centred = src - mean
        c = centred.mean(dim=-1, keepdim=True)
        centred, mean = centred - c, mean + c
        var = centred.square().mean(dim=-1, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        y = centred * rstd
    else:
        mean = None
        rstd = torch.rsqrt(src.square().mean(dim=-1, keepdim=True) + eps)
        y = src * rstd
    if weight is not None:
        y = y * (weight.float() + weight_offset)
    if bias is not None:
        y = y + bias.float()
    return y, mean, rstd


class _TorchFused(FusedNormKernel):
    backend = "torch"
    variant = "fused"
    repro_call = through_normdiff  # a repro calls normdiff's own kernel through normdiff (impls.repro_calls)
    writes = ("new", "in_place", "out_y")
    weight_offsets = (0.0, 1.0)
    residual_dtypes = ("same", "float32")
    source = "impls/torch_fused.py"

    def note(self) -> str:
        return f"torch {torch.__version__}, float32 composition"

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        # Everything is computed before anything is written: under write='in_place' y is x's
        # storage and residual_out residual's.
        src = x.float()
        if residual is not None:
            src = src + residual.float()
            r_out = src.to(out.residual_out.dtype)
            if self.stats_on == "rounded_sum":
                src = r_out.float()
        y, mean, rstd = normalize(self.op, src, weight, bias, eps, params.weight_offset)
        y = y.to(out.y.dtype) if params.out_dtype is None else quantize_fp8(y, params, self.scale_convention)
        if residual is not None:
            out.residual_out.copy_(r_out)
        out.y.copy_(y)
        if out.mean is not None:
            out.mean.copy_(mean.view(-1))
        if out.rstd is not None:
            out.rstd.copy_(rstd.view(-1))

    def _backward(self, src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out: FusedGrads) -> None:
        # autograd of the float32 composition on what was normalised; residual_out passes its
        # gradient straight to x and residual. Leaves detached: on a float32 tensor .float() is the
        # caller's own tensor, whose requires_grad the call must not set.
        with torch.enable_grad():
            leaves = [src.detach().float().requires_grad_()]
            w = b = None
            if weight is not None:
                w = weight.detach().float().requires_grad_()
                leaves.append(w)
            if bias is not None:
                b = bias.detach().float().requires_grad_()
                leaves.append(b)
            y, _, _ = normalize(self.op, leaves[0], w, b, eps, weight_offset)
            grads = torch.autograd.grad(y, leaves, dy.float())
        ds = grads[0] if d_residual_out is None else grads[0] + d_residual_out.float()
        out.dx.copy_(ds)
        if out.dresidual is not None:
            out.dresidual.copy_(ds)
        rest = list(grads[1:])
        if out.dw is not None:
            out.dw.copy_(rest.pop(0))
        if out.db is not None:
            out.db.copy_(rest.pop(0))


@register
class TorchAddRMSNorm(_TorchFused):
    op = "add_rms_norm"
    outputs = ("y", "residual_out", "rstd")
    out_dtypes = (None, *FP8_DTYPES)


@register
class TorchAddLayerNorm(_TorchFused):
    op = "add_layer_norm"
    outputs = ("y", "residual_out", "mean", "rstd")
    weight_offsets = (0.0,)


@register
class TorchRMSNormFused(_TorchFused):
    """rms_norm with Gemma's offset or an fp8 output."""
    op = "rms_norm"
    outputs = ("y", "rstd")
    writes = ("new",)
    out_dtypes = (None, *FP8_DTYPES)


@register
class TorchLayerNormFused(_TorchFused):
    """layer_norm with an fp8 output."""
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    writes = ("new",)
    weight_offsets = (0.0,)
    out_dtypes = (None, *FP8_DTYPES)
