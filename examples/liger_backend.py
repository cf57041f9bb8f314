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

import torch

from impls.base import NormGrads, NormKernel, NormOutputs, NormSpec, OptionalImport, ReproCall, cuda_present
from impls.fused import FusedGrads, FusedNormKernel, FusedOutputs, FusedParams
from impls.registry import register

LIGER_VERSION = "0.8.5"
MAX_N = 65536  # liger_kernel.ops.utils.calculate_settings: MAX_FUSED_SIZE
LIGER = OptionalImport("liger_kernel.ops.rms_norm", "liger_kernel.ops.layer_norm",
                       missing=f"liger_kernel not importable: pip install liger-kernel=={LIGER_VERSION}")


def repro_call(kernel) -> ReproCall:
    """A standalone repro (python -m harness.repro): the kernel's Liger module, imported as the
    plug-in imports it (``liger``), called as _forward and _backward call it (repro_forward and
    repro_backward)."""
    imports = ("import importlib\n\nfrom liger_kernel.ops.utils import calculate_settings\n\n"
               f"liger = importlib.import_module({kernel.liger_module!r})")
    return ReproCall(imports=imports, forward=kernel.repro_forward, backward=kernel.repro_backward,
                     source=f"NUM_STAGES = {NUM_STAGES}" if "NUM_STAGES" in kernel.repro_backward else "",
                     requires=f"pip install liger-kernel=={LIGER_VERSION}")


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

    repro_call = repro_call


@register
class LigerRMSNorm(_Liger):
    op = "rms_norm"
    outputs = ("y", "rstd")
    call_name = "liger_kernel.ops.rms_norm.rms_norm_forward(x, weight, eps, 0.0, 'gemma', None)"
    liger_module = "liger_kernel.ops.rms_norm"

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

    repro_forward = """
y, _, rstd, *_ = liger.rms_norm_forward(x, weight, eps, 0.0, "gemma", None)
out.y.copy_(y.view(out.y.shape))
out.rstd.copy_(rstd.reshape(-1))
"""
    repro_backward = """
block, warps = calculate_settings(x.shape[-1])
mode = getattr(liger, "_str_to_casting_mode", {}).get("gemma", 1)
dx, dw = liger.rms_norm_backward(dy.contiguous(), x.contiguous(), weight, saved.rstd.contiguous(), 0.0, mode,
                                 block, warps, False, None)
out.dx.copy_(dx.view(out.dx.shape))
if out.dw is not None:
    out.dw.copy_(dw)
"""


@register
class LigerLayerNorm(_Liger):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    call_name = "liger_kernel.ops.layer_norm.layer_norm_forward(x, weight, bias, eps)"
    liger_module = "liger_kernel.ops.layer_norm"

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

    repro_forward = """
y, _, mean, rstd, *_ = liger.layer_norm_forward(x, weight, bias, eps)
out.y.copy_(y.view(out.y.shape))
out.mean.copy_(mean.reshape(-1))
out.rstd.copy_(rstd.reshape(-1))
"""
    repro_backward = """
dx, dw, db = liger.layer_norm_backward(dy.contiguous(), x.contiguous(), weight, bias, saved.mean.contiguous(),
                                      saved.rstd.contiguous())
out.dx.copy_(dx.view(out.dx.shape))
out.dw.copy_(dw)
out.db.copy_(db)
"""


# -- the fused family (impls.fused) -----------------------------------------------------------------
# Liger's fused residual add + RMSNorm, through the functions LigerFusedAddRMSNormFunction calls
# (liger_kernel/ops/fused_add_rms_norm.py of the 0.8.5 wheel, fa.py below; the submodule, which
# Liger's backend replacement leaves alone, liger_kernel/ops/__init__.py:11-14):
# - fused_add_rms_norm_forward(X, R, W, eps, offset, casting_mode) -> (Y, S, RSTD, BLOCK_SIZE,
#   num_warps, num_stages, casting_mode) (fa.py:231-286): Y and S new, both in X's dtype
#   (fa.py:247-248): writes "new" only, residual_out in x's dtype.
# - S = X + R in the loaded dtype, stored (fa.py:79-80); with one dtype the sum is rounded to it
#   before anything else, and the "gemma" casting mode then computes rstd and y in float32 on that
#   rounded sum (fa.py:89-91, :101-120): stats_on "rounded_sum". With a float32 residual and 16-bit
#   x, Triton adds in float32 and only the store rounds, so rstd and y would come from the unrounded
#   sum while S is rounded: only a residual of x's dtype is declared (and LigerFusedAddRMSNorm
#   returns dR = dX in x's dtype, fa.py:360).
# - casting mode "gemma" (float32 throughout, y rounded once), with offset 0 (RMSNorm) and 1
#   (Gemma), as Liger's Gemma norms are: offset=1.0, casting_mode="gemma" (LigerRMSNormForGemma,
#   liger_kernel/transformers/rms_norm.py:52-56, put in for GemmaRMSNorm, monkey_patch.py:1104-1111).
#   offset + W in float32 (fa.py:93-99, :115). RSTD is float32 in this mode (fa.py:251-252).
# - eps and offset go as float32 scalars (fa.py:97-99); N at most 65536 (calculate_settings,
#   liger_kernel/ops/utils.py:57-65).
# - backward: fused_add_rms_norm_backward(dY, dS_out, S, W, RSTD, offset, casting_mode, BLOCK_SIZE,
#   num_warps, num_stages, in_place) -> (dX, dR, dW) with dR = dX = the norm's gradient + dS_out
#   (fa.py:289-360, :208-216). in_place=True would write dX over dY (fa.py:317-318); False here, so
#   the caller's dy is not overwritten (a new dX, fa.py:320).
# Found by reading (documentation vs code):
# - LigerFusedAddRMSNormFunction's docstring (fa.py:386) says in_place "defaults to `True`"; its
#   forward's default is in_place=False (fa.py:391), as is LigerFusedAddRMSNorm's (liger_kernel/
#   transformers/fused_add_rms_norm.py:15).
# - fused_add_rms_norm_backward passes has_dS_out=dS_out is not None to its kernel (fa.py:352), but
#   views dS_out unconditionally first (fa.py:295): dS_out=None raises AttributeError. Autograd
#   always materialises a zero dS_out, so the Function does not meet it; a direct caller passing
#   None does (this plug-in passes zeros where d_residual_out is None, as autograd does).
# - its "feature dim >= 64KB" check (fa.py:312-313) compares N with BLOCK_SIZE = next_power_of_2(N)
#   (utils.py:61): it never fires (calculate_settings refuses N > 65536 first).
LIGER_FUSED = OptionalImport("liger_kernel.ops.fused_add_rms_norm",
                             missing=f"liger_kernel not importable: pip install liger-kernel=={LIGER_VERSION}")
NUM_STAGES = 2  # fused_add_rms_norm_forward's num_stages (fa.py:245), returned for the backward


def _fused_add():
    mods = LIGER_FUSED.modules()
    return None if mods is None else mods[0]


@register
class LigerFusedAddRMSNorm(FusedNormKernel):
    op = "add_rms_norm"
    backend = "liger"
    variant = "fused_add"
    packages = ("liger-kernel",)
    devices = ("cuda",)
    max_n = MAX_N
    outputs = ("y", "residual_out", "rstd")
    writes = ("new",)
    stats_on = "rounded_sum"
    weight_offsets = (0.0, 1.0)
    residual_dtypes = ("same",)
    call_name = ("liger_kernel.ops.fused_add_rms_norm.fused_add_rms_norm_forward(x, residual, weight, eps, offset, "
                 "'gemma')")
    liger_module = "liger_kernel.ops.fused_add_rms_norm"
    source = ("liger_kernel/ops/fused_add_rms_norm.py:231-286 (new Y and S in X's dtype :247-248), :32-120 "
              "(S = X + R rounded :79-80, gemma casting :89-91, y :109-120); backward :289-360 (in_place :317-320), "
              ":123-221; LigerFusedAddRMSNormFunction :363-432")

    def availability(self) -> str | None:
        if _fused_add() is None:
            return LIGER_FUSED.reason
        if not cuda_present():
            return "liger needs a CUDA device (its Triton kernels do not run under Triton's interpreter)"
        return None

    def note(self) -> str:
        import importlib.metadata as md

        try:
            version = md.version("liger-kernel")
        except md.PackageNotFoundError:
            version = "not installed"
        return f"liger-kernel {version} (written for {LIGER_VERSION}); casting_mode='gemma', offset 0 or 1"

    def residual_out_dtype(self, x_dtype, residual_dtype):
        return x_dtype  # S = torch.empty(..., dtype=X.dtype) (fa.py:248)

    def unsupported(self, spec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not spec.has_weight:
            return "liger's fused_add_rms_norm_forward needs a weight (it reads W unconditionally)"
        return None

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        offset = float(params.weight_offset)
        y, s, rstd, *_ = _fused_add().fused_add_rms_norm_forward(x, residual, weight, eps, offset, "gemma")
        out.y.copy_(y.view(out.y.shape))
        out.residual_out.copy_(s.view(out.residual_out.shape))
        out.rstd.copy_(rstd.reshape(-1))

    def bench_fused_callable(self, x, residual, weight, bias, eps, params, out):
        """Liger's forward as its autograd function calls it (it allocates Y and S), without the copies."""
        fn, offset = _fused_add().fused_add_rms_norm_forward, float(params.weight_offset)
        return lambda: fn(x, residual, weight, eps, offset, "gemma")

    def _backward(self, src, weight, bias, dy, d_residual_out, saved, eps, weight_offset, out: FusedGrads) -> None:
        mod = _fused_add()
        from liger_kernel.ops.utils import calculate_settings

        block, warps = calculate_settings(src.shape[-1])
        mode = mod._str_to_casting_mode["gemma"]  # the forward's int form (fa.py:224-228)
        ds = torch.zeros_like(src) if d_residual_out is None else d_residual_out  # fa.py:295 needs a tensor
        # in_place=False: dX into a new tensor, not over dy (fa.py:317-320).
        dx, dr, dw = mod.fused_add_rms_norm_backward(dy, ds, src, weight, saved.rstd.contiguous(), weight_offset,
                                                     mode, block, warps, NUM_STAGES, False)
        out.dx.copy_(dx.view(out.dx.shape))
        if out.dresidual is not None:
            out.dresidual.copy_(dr.view(out.dresidual.shape))
        if out.dw is not None:
            out.dw.copy_(dw)

    repro_call = repro_call
    repro_forward = """
y, s, rstd, *_ = liger.fused_add_rms_norm_forward(x, residual, weight, eps, float(params.weight_offset), "gemma")
out.y.copy_(y.view(out.y.shape))
out.residual_out.copy_(s.view(out.residual_out.shape))
out.rstd.copy_(rstd.reshape(-1))
"""
    repro_backward = """
block, warps = calculate_settings(src.shape[-1])
mode = liger._str_to_casting_mode["gemma"]
ds = torch.zeros_like(src) if d_residual_out is None else d_residual_out
dx, dr, dw = liger.fused_add_rms_norm_backward(dy, ds, src, weight, saved.rstd.contiguous(), weight_offset,
                                               mode, block, warps, NUM_STAGES, False)
out.dx.copy_(dx.view(out.dx.shape))
if out.dresidual is not None:
    out.dresidual.copy_(dr.view(out.dresidual.shape))
if out.dw is not None:
    out.dw.copy_(dw)
"""
