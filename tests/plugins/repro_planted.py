"""Kernels with planted bugs and their honest twins, for the standalone repros' tests
(tests/test_repro.py). Eager torch, and nothing of the project but the interface: each declares its
standalone call (``repro_call``) with the module's functions copied into the repro as its source.

- ``reproplant.padded`` (RMSNorm): the sum of squares divided by the padded tile, the next power
  of two of N (wrong wherever N is not a power of two); ``reproplant.honest``: divided by N.
- ``reproplant.refuses``: raises on odd N (a refused build, the exception form).
- ``reproplant.lastcol``: leaves the last column of y unwritten (the write-guard form).
- ``reproplant.inplace`` / ``inplace_honest`` (add_rms_norm, in place): the padded tile again,
  writing y into x and residual_out into residual.
"""
import inspect

import torch

from impls.base import NormKernel, ReproCall
from impls.fused import FusedNormKernel
from impls.registry import register


def planted_rms_norm(x, weight, eps, padded):
    """y and rstd of 2-D rows; ``padded`` divides by the next power of two of N (the planted bug)."""
    xf = x.float()
    n = xf.shape[-1]
    rstd = torch.rsqrt(xf.pow(2).sum(-1) / ((1 << (n - 1).bit_length()) if padded else n) + eps)
    y = xf * rstd[:, None]
    return (y if weight is None else y * weight.float()).to(x.dtype), rstd


def refusing_rms_norm(x, weight, eps):
    if x.shape[-1] % 2:
        raise ValueError(f"'cp_size' only supports (32, 64, 128), but got 16 (N={x.shape[-1]} is odd)")
    return planted_rms_norm(x, weight, eps, padded=False)


SOURCE = inspect.getsource(planted_rms_norm)
FORWARD = "y, rstd = planted_rms_norm(x, weight, eps, padded={padded})\nout.y.copy_(y)\nout.rstd.copy_(rstd)"


class _Planted(NormKernel):
    op, backend = "rms_norm", "reproplant"
    outputs = ("y", "rstd")
    padded = True

    def _forward(self, x, weight, bias, eps, out):
        y, rstd = planted_rms_norm(x, weight, eps, self.padded)
        out.y.copy_(y)
        out.rstd.copy_(rstd)

    def repro_call(self):
        return ReproCall(imports="", source=SOURCE, forward=FORWARD.format(padded=self.padded))


@register
class Padded(_Planted):
    variant = "padded"


@register
class Honest(_Planted):
    variant, padded = "honest", False


@register
class Refuses(_Planted):
    variant = "refuses"

    def _forward(self, x, weight, bias, eps, out):
        y, rstd = refusing_rms_norm(x, weight, eps)
        out.y.copy_(y)
        out.rstd.copy_(rstd)

    def repro_call(self):
        return ReproCall(imports="", source=SOURCE + "\n\n" + inspect.getsource(refusing_rms_norm),
                         forward="y, rstd = refusing_rms_norm(x, weight, eps)\nout.y.copy_(y)\nout.rstd.copy_(rstd)")


@register
class LastColumn(_Planted):
    variant, padded = "lastcol", False

    def _forward(self, x, weight, bias, eps, out):
        y, rstd = planted_rms_norm(x, weight, eps, False)
        out.y[:, :-1].copy_(y[:, :-1])
        out.rstd.copy_(rstd)

    def repro_call(self):
        return ReproCall(imports="", source=SOURCE, forward="y, rstd = planted_rms_norm(x, weight, eps, padded=False)\n"
                         "out.y[:, :-1].copy_(y[:, :-1])  # the last column left unwritten\nout.rstd.copy_(rstd)")


def fused_add(x, residual, weight, eps, offset, padded, y, residual_out, rstd):
    """residual_out = x + residual; y = its RMSNorm (float32 sum), into the given tensors."""
    s = x.float() + residual.float()
    w = None if weight is None else (weight.float() + offset).to(x.dtype)
    out_y, out_rstd = planted_rms_norm(s, w, eps, padded)
    residual_out.copy_(s)
    y.copy_(out_y)
    rstd.copy_(out_rstd)


@register
class InPlace(FusedNormKernel):
    op, backend, variant = "add_rms_norm", "reproplant", "inplace"
    outputs = ("y", "residual_out", "rstd")
    writes = ("new", "in_place")
    padded = True

    def _forward(self, x, residual, weight, bias, eps, params, out):
        fused_add(x, residual, weight, eps, params.weight_offset, self.padded, out.y, out.residual_out, out.rstd)

    def repro_call(self):
        return ReproCall(imports="", source=SOURCE + "\n\n" + inspect.getsource(fused_add),
                         forward=f"fused_add(x, residual, weight, eps, params.weight_offset, {self.padded}, out.y, "
                                 "out.residual_out, out.rstd)")


@register
class InPlaceHonest(InPlace):
    variant, padded = "inplace_honest", False
