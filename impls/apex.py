"""NVIDIA apex's fused LayerNorm and RMSNorm CUDA kernels, through the entry points of its
``fused_layer_norm_cuda`` extension.

Only those entry points are called, never apex's Python modules (FusedLayerNorm, FusedRMSNorm):
they fall back silently to PyTorch math on CPU tensors and under compilation, and that fallback
must never be tested or timed under apex's name. The extension is imported on first use, so this
module imports, and its kernels register (skipped with the reason), where apex is missing.

Entry points (csrc/layer_norm_cuda.cpp), each returning fresh tensors:
  forward(x, normalized_shape, eps)                        -> [y, mean, invvar]
  forward_affine(x, normalized_shape, weight, bias, eps)   -> [y, mean, invvar]
  rms_forward(x, normalized_shape, eps)                    -> [y, invvar]
  rms_forward_affine(x, normalized_shape, weight, eps)     -> [y, invvar]
invvar is rstd; mean and invvar have shape (M,) and dtype float32 for float32, float16 and
bfloat16 input. The backward entry points take the forward's saved statistics; since apex
added its memory-efficient mode (input_or_output: x, or y when memory_efficient is true) they
end in a ``memory_efficient`` flag, which older builds lack (both forms are called here, with
x and the flag false: the saved mean and invvar are used, nothing is recomputed from y):
  backward(dy, mean, invvar, x, normalized_shape, eps[, memory_efficient])            -> dx
  backward_affine(dy, mean, invvar, x, normalized_shape, weight, bias, eps[, m_e])    -> [dx, dw, db]
  rms_backward(dy, invvar, x, normalized_shape, eps[, memory_efficient])              -> dx
  rms_backward_affine(dy, invvar, x, normalized_shape, weight, eps[, m_e])            -> [dx, dw]
dw and db come from apex's own two-stage column reduction (partial sums per block of rows,
then a reduction of those), every element written, no atomics. Declared limits, from that source:
- x must be contiguous: rows with a stride are copied first, as apex's own modules do.
- LayerNorm takes weight and bias together or neither: there is no weight-only entry point
  (forward_affine requires a bias tensor, and the kernel treats a weight without a bias as no
  affine at all). A zero bias would run the same kernel, but it is not what a caller of apex
  gets for a weight-only LayerNorm, so weight-only cases are skipped with the reason.
- Element offsets are 32-bit ints (``i1 * n2``), so M * N must stay below 2**31.
- weight and bias have x's dtype (the non-mixed entry points read them as the output type).

Declared known issue (``clamp_shift``): cuComputeGradInput multiplies each element's dy by
``clamp_by_magnitude(gamma, eps)`` (|gamma| raised to eps), also without memory_efficient, where
its row sums take gamma as it is; so where |w_j| < eps, dx_j moves by rstd * dy_j * (clamp(w_j) - w_j),
which is not the gradient of the forward it computed. The GPU fuzz found it at eps 1e-3 (layer_norm
1 x 483, w[393] = -6.3e-5: 45.6 x the allowance; rms_norm 1 x 1 x 129, w[57] = -4.5e-4: 20.6 x);
tools/apex_one_row.py reproduces both.
"""
from __future__ import annotations

import torch

from impls.base import NormGrads, NormKernel, NormOutputs, NormSpec, OptionalImport, ReproCall, cuda_present
from impls.reference import reference
from impls.registry import register
from impls.repro_calls import source_of

EXTENSION = "fused_layer_norm_cuda"
MAX_ELEMENTS = 2**31 - 1  # the kernels index elements with int
EXT = OptionalImport(EXTENSION, missing=f"{EXTENSION} not importable (apex built without its CUDA extensions): see README")
APEX_BUILD = ("apex with its CUDA extensions, built from a clone of NVIDIA/apex: APEX_CPP_EXT=1 APEX_CUDA_EXT=1 "
              "pip install -v --no-build-isolation .")


def _load():
    """The extension module, or None (EXT.reason says why)."""
    modules = EXT.modules()
    return modules[0] if modules else None


def availability() -> str | None:
    if _load() is None:
        return EXT.reason
    if not cuda_present():
        return f"{EXTENSION} imports but no CUDA device is present (apex's kernels run only on CUDA)"
    return None


# The clamp's own shift of dx in units of dx's allowance (clamp_shift): from CLAMP_DECLARED a case is
# a declared known issue, from CLAMP_MUST_FAIL it must fail; between, it may pass. apex's dx errs
# otherwise by about 0.02-0.13 of the allowance, plus up to half an ulp of a 16-bit dx (of the one
# ulp allowed): a shift under 0.5 cannot fail, one over 2 must. In between, e.g. the catalogue's
# layer_norm-float16-1x8192-normal-dynormal (a float16 weight below the default 1e-5: 1.1 x), which
# passed on an H100.
CLAMP_DECLARED = 0.5
CLAMP_MUST_FAIL = 2.0


def clamp_shift(op: str, x, weight, bias, dy, eps: float, dx_allowance) -> float:
    """How far apex's clamp of |weight| to eps moves dx from the gradient, at worst, in units of
    dx's allowance: ``dx_allowance``, a zero-argument callable giving the error the harness's
    backward check allows in each element of dx (x's shape), called only where some |weight| is
    below eps. 0.0 where none is."""
    if weight is None:
        return 0.0
    floor = torch.tensor(eps, dtype=weight.dtype, device=weight.device)  # apex's kMinGamma = V(eps)
    clamped = torch.where(weight >= 0, torch.maximum(weight, floor), torch.minimum(weight, -floor))
    if bool((clamped == weight).all()):
        return 0.0
    n = x.shape[-1]
    rstd = torch.nan_to_num(reference(op, x, None, None, eps).rstd.reshape(-1, 1).double(), nan=0.0, posinf=0.0)
    g = torch.nan_to_num(dy.reshape(-1, n).double(), nan=0.0, posinf=0.0, neginf=0.0)
    shift = rstd * g * (clamped.double() - weight.double())
    return float((shift.abs() / dx_allowance().reshape(-1, n)).max())


# clamp_shift of a backward case, by (op, case id, device): the declaration and may-pass both ask.
_SHIFTS: dict[tuple[str, str, str], float] = {}


def _case_clamp_shift(op: str, case, device: str, inputs) -> float:
    """clamp_shift of a backward case's inputs as the checks draw them on ``device`` (a GPU): 0.0
    for a forward case, one without a weight, or where the harness hands no inputs."""
    if device != "cuda" or inputs is None or case.dy_dist is None or not case.has_weight:
        return 0.0
    key = (op, case.id, device)
    if key not in _SHIFTS:
        drawn = inputs()
        _SHIFTS[key] = clamp_shift(op, drawn.x, drawn.weight, drawn.bias, drawn.dy, drawn.eps,
                                   lambda: drawn.allowance("dx"))
    return _SHIFTS[key]


def _version() -> str:
    import importlib.metadata as md

    try:
        return md.version("apex")
    except md.PackageNotFoundError:
        return "version unknown"


def _backward_call(fn, *args):
    """Call the backward entry point ``fn`` with memory_efficient=False, or without the flag on
    builds from before it (their signature is the same less that last argument)."""
    try:
        return fn(*args, False)
    except TypeError as exc:
        if "incompatible function arguments" not in str(exc):
            raise
        return fn(*args)


class _Apex(NormKernel):
    backend = "apex"
    packages = ("apex",)
    variant = "fused"
    devices = ("cuda",)
    # apex's kernels round x^ to the input dtype before the weight multiply, and x^ * w again
    # before adding the bias: judged under that contract (harness.judging.compare.rounding_allowance).
    rounding = "before_affine"

    def availability(self) -> str | None:
        return availability()

    def known_issue(self, case, device: str, inputs=None) -> str | None:
        shift = _case_clamp_shift(self.op, case, device, inputs)
        if shift < CLAMP_DECLARED:
            return None
        return (f"apex's dx raises |weight| below eps to eps in each element's term (clamp_by_magnitude in "
                f"cuComputeGradInput, without memory_efficient too) but not in its row sums: that alone moves "
                f"dx by {shift:.3g} x its allowance here")

    def known_issue_may_pass(self, case, device: str, inputs=None) -> bool:
        return _case_clamp_shift(self.op, case, device, inputs) < CLAMP_MUST_FAIL

    def note(self) -> str:
        return (f"apex {_version()}, {EXTENSION} entry points; rows with a stride are copied to contiguous first; "
                "y rounded to the input dtype before the weight and before the bias (judged under that contract)")

    def repro_call(self) -> ReproCall:
        """The extension's entry points as _forward and _backward call them (repro_forward, repro_backward)."""
        return ReproCall(imports=f"import {EXTENSION}  # apex's CUDA extension", source=source_of(_backward_call),
                         forward=self.repro_forward, backward=self.repro_backward, requires=APEX_BUILD)

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if spec.rows * spec.n > MAX_ELEMENTS:
            return f"M*N={spec.rows * spec.n} exceeds apex's 32-bit element indexing (at most {MAX_ELEMENTS})"
        return None


@register
class ApexRMSNorm(_Apex):
    op = "rms_norm"
    outputs = ("y", "rstd")
    call_name = f"{EXTENSION}.rms_forward_affine(x, [N], weight, eps)"

    def _call(self, x, weight, bias, eps):
        ext = _load()
        if weight is None:
            return ext.rms_forward(x, [x.shape[-1]], eps)
        return ext.rms_forward_affine(x, [x.shape[-1]], weight, eps)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        y, invvar = self._call(x.contiguous(), weight, bias, eps)
        out.y.copy_(y)
        out.rstd.copy_(invvar.reshape(-1))

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        x, dy, rstd, n = x.contiguous(), dy.contiguous(), saved.rstd.contiguous(), [x.shape[-1]]
        if weight is None:
            out.dx.copy_(_backward_call(_load().rms_backward, dy, rstd, x, n, eps))
            return
        dx, dw = _backward_call(_load().rms_backward_affine, dy, rstd, x, n, weight, eps)
        out.dx.copy_(dx)
        out.dw.copy_(dw)

    repro_forward = """
x = x.contiguous()
if weight is None:
    y, invvar = fused_layer_norm_cuda.rms_forward(x, [x.shape[-1]], eps)
else:
    y, invvar = fused_layer_norm_cuda.rms_forward_affine(x, [x.shape[-1]], weight, eps)
out.y.copy_(y)
out.rstd.copy_(invvar.reshape(-1))
"""
    repro_backward = """
x, dy, rstd, n = x.contiguous(), dy.contiguous(), saved.rstd.contiguous(), [x.shape[-1]]
if weight is None:
    out.dx.copy_(_backward_call(fused_layer_norm_cuda.rms_backward, dy, rstd, x, n, eps))
else:
    dx, dw = _backward_call(fused_layer_norm_cuda.rms_backward_affine, dy, rstd, x, n, weight, eps)
    out.dx.copy_(dx)
    out.dw.copy_(dw)
"""


@register
class ApexLayerNorm(_Apex):
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    call_name = f"{EXTENSION}.forward_affine(x, [N], weight, bias, eps)"

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if spec.has_weight != spec.has_bias:
            return ("apex's LayerNorm takes weight and bias together or neither "
                    "(no weight-only entry point in fused_layer_norm_cuda)")
        return None

    def _call(self, x, weight, bias, eps):
        ext = _load()
        if weight is None:
            return ext.forward(x, [x.shape[-1]], eps)
        return ext.forward_affine(x, [x.shape[-1]], weight, bias, eps)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        y, mean, invvar = self._call(x.contiguous(), weight, bias, eps)
        out.y.copy_(y)
        out.mean.copy_(mean.reshape(-1))
        out.rstd.copy_(invvar.reshape(-1))

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        x, dy, n = x.contiguous(), dy.contiguous(), [x.shape[-1]]
        mean, rstd = saved.mean.contiguous(), saved.rstd.contiguous()
        if weight is None:  # weight and bias together or neither (unsupported() refuses the rest)
            out.dx.copy_(_backward_call(_load().backward, dy, mean, rstd, x, n, eps))
            return
        dx, dw, db = _backward_call(_load().backward_affine, dy, mean, rstd, x, n, weight, bias, eps)
        out.dx.copy_(dx)
        out.dw.copy_(dw)
        out.db.copy_(db)

    repro_forward = """
x = x.contiguous()
if weight is None:
    y, mean, invvar = fused_layer_norm_cuda.forward(x, [x.shape[-1]], eps)
else:
    y, mean, invvar = fused_layer_norm_cuda.forward_affine(x, [x.shape[-1]], weight, bias, eps)
out.y.copy_(y)
out.mean.copy_(mean.reshape(-1))
out.rstd.copy_(invvar.reshape(-1))
"""
    repro_backward = """
x, dy, n = x.contiguous(), dy.contiguous(), [x.shape[-1]]
mean, rstd = saved.mean.contiguous(), saved.rstd.contiguous()
if weight is None:
    out.dx.copy_(_backward_call(fused_layer_norm_cuda.backward, dy, mean, rstd, x, n, eps))
else:
    dx, dw, db = _backward_call(fused_layer_norm_cuda.backward_affine, dy, mean, rstd, x, n, weight, bias, eps)
    out.dx.copy_(dx)
    out.dw.copy_(dw)
    out.db.copy_(db)
"""
