"""Test plug-in: kernels that declare 16-bit dtypes only, as FlashInfer does (RMSNorm float16 and
bfloat16, LayerNorm bfloat16, weight required), and raise UnsupportedCase on float32; CPU, correct.

- ``halfonly.default``: the plain kernel. Every check that builds valid inputs itself must call it
  in a dtype it declares, or skip with its reason.
- ``halfonly.refuses``: declares float16 and bfloat16 but refuses every call it is given from
  ``_forward`` (a capacity limit known only at the call): valid inputs it refuses are a skip.
- ``halfonly.oddfails``: declares a known issue on 16-bit rows of odd N and fails there (as QuACK's
  compile refusal), forward and backward: the property checks report the issue, not a failure.
"""
import torch

from impls.base import NormGrads, NormKernel, UnsupportedCase
from impls.reference import reference, reference_backward
from impls.registry import register


class _Half(NormKernel):
    backend = "halfonly"
    devices = ("cpu",)

    def unsupported(self, spec):
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not spec.has_weight or (self.op == "layer_norm" and not spec.has_bias):
            return f"{self.name} needs the full affine form"
        return None

    def _forward(self, x, weight, bias, eps, out):
        ref = reference(self.op, x, weight, bias, eps)
        out.y.copy_(ref.y)
        for name in self.outputs[1:]:
            getattr(out, name).copy_(getattr(ref, name))

    def _backward(self, x, weight, bias, dy, saved, eps, out: NormGrads):
        ref = reference_backward(self.op, x, dy, weight, bias, eps)
        out.dx.copy_(ref.dx)
        for name in ("dw", "db"):
            if getattr(out, name) is not None:
                getattr(out, name).copy_(getattr(ref, name))


@register
class HalfRMSNorm(_Half):
    op = "rms_norm"
    outputs = ("y", "rstd")
    dtypes = (torch.float16, torch.bfloat16)


@register
class HalfLayerNorm(_Half):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    dtypes = (torch.bfloat16,)


class _Refuses(_Half):
    variant = "refuses"

    def _forward(self, x, weight, bias, eps, out):
        raise UnsupportedCase(f"{self.name} has no kernel for rows of {x.shape[-1]} here")


@register
class RefusesRMSNorm(_Refuses):
    op = "rms_norm"
    outputs = ("y", "rstd")
    dtypes = (torch.float16, torch.bfloat16)


ODD = "halfonly.oddfails cannot build 16-bit rows of odd N (a stand-in for a peer's compile refusal)"


class _OddFails(_Half):
    variant = "oddfails"
    dtypes = (torch.float16, torch.bfloat16)

    def known_issue(self, case, device, inputs=None):
        return ODD if case.dtype in ("float16", "bfloat16") and case.n % 2 else None

    def _forward(self, x, weight, bias, eps, out):
        if x.shape[-1] % 2:
            raise RuntimeError("cp_size 16 refused")
        super()._forward(x, weight, bias, eps, out)

    def _backward(self, x, weight, bias, dy, saved, eps, out):
        if x.shape[-1] % 2:
            raise RuntimeError("cp_size 16 refused")
        super()._backward(x, weight, bias, dy, saved, eps, out)


@register
class OddFailsRMSNorm(_OddFails):
    op = "rms_norm"
    outputs = ("y", "rstd")
