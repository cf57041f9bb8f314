"""Liger-Kernel (``pip install liger-kernel==0.8.5``) as an outside backend, loaded with

    pytest harness --backend-file examples/liger_backend.py --backend liger

It registers backend "liger": RMSNorm through liger_kernel.ops.rms_norm.rms_norm_forward and
LayerNorm through liger_kernel.ops.layer_norm.layer_norm_forward, the functions Liger's autograd
Functions call, with Liger's own launch choices. liger_kernel is imported on first use, so this
file loads, and its kernels register (skipped with the reason), where Liger is missing.

What the 0.8.5 functions return, and how it is normalised here:
- rms_norm_forward(X, W, eps, offset, casting_mode, row_mode) -> (Y, X, RSTD, BLOCK_SIZE,
  num_warps, casting_mode); RSTD has shape (M,), float32 in the "llama" and "gemma" casting
  modes, x's dtype in "none".
- layer_norm_forward(X, W, B, eps) -> (Y, X, Mean, RSTD, BLOCK_SIZE, num_warps); Mean and RSTD
  have shape (M,) and are float32.
Both read rows through X's row stride, so strided rows run as they are.

RMSNorm casting mode: "gemma" with offset 0, which computes x * rstd * w in float32 and rounds y
once, the plain RMSNorm the oracle defines. Liger's default "llama" mode rounds x * rstd to x's
dtype before the weight multiply (Hugging Face Llama's order); in float16 and bfloat16 that second
rounding exceeds the one-ulp tolerance by design, so it would test the mode, not the kernel.
For float32 input the two modes are the same computation.

Backward, through the functions Liger's autograd Functions call:
- rms_norm_backward(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place,
  row_mode) -> (dX, dW); casting_mode as the forward returns it (an int), BLOCK_SIZE and num_warps
  from liger_kernel.ops.utils.calculate_settings(N) as the forward's; in_place=False, so dY (the
  caller's buffer) is not overwritten with dX.
- layer_norm_backward(dY, X, W, B, Mean, RSTD) -> (dX, dW, dB).
Both take the forward's saved RSTD (and Mean); dW and dB are float32 partials per SM (one program
per SM, rows split evenly among them), summed by torch: the partials depend on the GPU's SM count
and on M (rows per program), so dw's bits change with M's split; no atomics.
(Read from Liger-Kernel's main branch at version 0.8.2; the 0.8.5 forward signatures above are
unchanged there, and these are assumed the same in 0.8.5, not run here.)

Declared limits (Liger 0.8.5):
- N <= 65536: calculate_settings refuses a block (next power of two >= N) above 65536 elements.
- LayerNorm needs weight and bias: layer_norm_forward reads both unconditionally.
- CUDA only: Triton's interpreter cannot run these kernels (they call ``eps.to(...)`` on a scalar
  argument, which the interpreter passes as a Python float).
"""
from __future__ import annotations

from impls.base import NormGrads, NormKernel, NormOutputs, NormSpec, OptionalImport, cuda_present
from impls.registry import register

LIGER_VERSION = "0.8.5"
MAX_N = 65536  # liger_kernel.ops.utils.calculate_settings: MAX_FUSED_SIZE
LIGER = OptionalImport("liger_kernel.ops.rms_norm", "liger_kernel.ops.layer_norm",
                       missing=f"liger_kernel not importable: pip install liger-kernel=={LIGER_VERSION}")


def _ops():
    """(rms_norm module, layer_norm module), or None (LIGER.reason says why)."""
    return LIGER.modules()


def availability() -> str | None:
    if _ops() is None:
        return LIGER.reason
    if not cuda_present():
        return "liger needs a CUDA device (its Triton kernels do not run under Triton's interpreter)"
    return None


class _Liger(NormKernel):
    backend = "liger"
    packages = ("liger-kernel",)
    variant = "fused"  # RMSNorm in casting_mode "gemma": float32 math, y rounded once
    devices = ("cuda",)
    max_n = MAX_N

    def availability(self) -> str | None:
        return availability()

    def note(self) -> str:
        import importlib.metadata as md

        try:
            version = md.version("liger-kernel")
        except md.PackageNotFoundError:
            version = "not installed"
        return f"liger-kernel {version} (written for {LIGER_VERSION}); RMSNorm casting_mode='gemma', offset=0"


@register
class LigerRMSNorm(_Liger):
    op = "rms_norm"
    outputs = ("y", "rstd")
    call_name = "liger_kernel.ops.rms_norm.rms_norm_forward(x, weight, eps, 0.0, 'gemma', None)"

    def _call(self, x, weight, bias, eps):
        rms, _ = _ops()
        return rms.rms_norm_forward(x, weight, eps, 0.0, "gemma", None)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        y, _, rstd, *_ = self._call(x, weight, bias, eps)
        out.y.copy_(y.view(out.y.shape))
        out.rstd.copy_(rstd.reshape(-1))  # float32 in this casting mode; copy_ converts otherwise

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        rms, _ = _ops()
        from liger_kernel.ops.utils import calculate_settings

        block, warps = calculate_settings(x.shape[-1])
        mode = getattr(rms, "_str_to_casting_mode", {}).get("gemma", 1)  # the forward's int form
        dx, dw = rms.rms_norm_backward(dy.contiguous(), x.contiguous(), weight, saved.rstd.contiguous(), 0.0, mode,
                                       block, warps, False, None)
        out.dx.copy_(dx.view(out.dx.shape))
        if out.dw is not None:
            out.dw.copy_(dw)


@register
class LigerLayerNorm(_Liger):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    call_name = "liger_kernel.ops.layer_norm.layer_norm_forward(x, weight, bias, eps)"

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not (spec.has_weight and spec.has_bias):
            return "liger's layer_norm_forward needs both weight and bias"
        return None

    def _call(self, x, weight, bias, eps):
        _, ln = _ops()
        return ln.layer_norm_forward(x, weight, bias, eps)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        y, _, mean, rstd, *_ = self._call(x, weight, bias, eps)
        out.y.copy_(y.view(out.y.shape))
        out.mean.copy_(mean.reshape(-1))
        out.rstd.copy_(rstd.reshape(-1))

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        _, ln = _ops()
        dx, dw, db = ln.layer_norm_backward(dy.contiguous(), x.contiguous(), weight, bias,
                                            saved.mean.contiguous(), saved.rstd.contiguous())
        out.dx.copy_(dx.view(out.dx.shape))
        out.dw.copy_(dw)
        out.db.copy_(db)
