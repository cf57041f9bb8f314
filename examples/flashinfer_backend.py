"""FlashInfer (``pip install flashinfer-python==0.7.2.post1``) as an outside backend, loaded with

    pytest harness --backend-file examples/flashinfer_backend.py --backend flashinfer

It registers backend "flashinfer", variant ``default``: ``flashinfer.norm.rmsnorm(x, weight, eps)``
and ``flashinfer.norm.layernorm(x, gamma, beta, eps)``, the entry points vLLM and SGLang call, on
FlashInfer's default path with its own launch choices (programmatic dependent launch where the GPU
has it, its cluster and vector plan by N). ``flashinfer`` is imported on first use, so this file
loads, and its kernels register (skipped with the reason), where FlashInfer is missing. Written
against flashinfer-python 0.7.2.post1 with nvidia-cutlass-dsl 4.7.1. Line numbers are of that
wheel's files: api.py stands for flashinfer/norm/__init__.py, rms.py for
flashinfer/norm/kernels/rmsnorm.py, ln.py for flashinfer/norm/kernels/layernorm.py, utils.py for
flashinfer/norm/utils.py and norm.cu for flashinfer/data/csrc/norm.cu.

The default path: the norms run FlashInfer's CuTe DSL kernels (rms.py, ln.py) unless
FLASHINFER_USE_CUDA_NORM=1 is set, the CuTe DSL does not import (api.py:63-77) or cannot target
the GPU (``_use_cuda_norm``, api.py:115-127); then its CUDA kernels, compiled by nvcc on first use
(``get_norm_module``, api.py:130-137, from norm.cu). The plug-in calls the public function either
way; its note (the report's backend line, the doctor) says which path the process is on.

Declarations, each with its source:
- devices: CUDA only (CuTe DSL or nvcc-compiled CUDA kernels).
- RMSNorm ``rmsnorm`` (api.py:641-675): out = empty_like(input) (api.py:673), then
  ``rmsnorm_cute`` (api.py:696), launched with PDL where the GPU has it (api.py:686-687).
  - dtypes: float16 and bfloat16. Its CUDA kernels dispatch those two only
    (DISPATCH_DLPACK_DTYPE_TO_CTYPE_FP16, norm.cu:44) and its tests run 16-bit inputs; float32
    is refused with that reason (the CuTe DSL kernel compiles it: not FlashInfer's contract, so
    not checked as if it were).
  - weight required, of x's dtype (the compiled kernel's weight is a compact tensor of x's dtype,
    rms.py:1177): RMSNorm without a weight is refused.
  - rows: contiguous rows take its compact kernel, assumed aligned to gcd(128, N * element bytes)
    bytes (rms.py:1158-1166); other rows its strided kernel, assumed 16-byte aligned with a row
    stride a multiple of its vector (rms.py:1167-1175; the vector is at most gcd(N, 16 bytes /
    element), rms.py:83-84). Rows that are neither are copied to fresh contiguous rows first,
    outside the timed call (bench_callable and user_call).
  - outputs: y only (no statistics are returned).
  - rounding: "once": y = x * rstd * (w + 0) in float32, rounded once (rms.py:406-408); rstd by
    rsqrt.approx (``fastmath=True``, rms.py:389).
  - no N limit in the source: rows beyond one block's shared memory span a cluster of up to 16
    blocks (``_compute_cluster_n``, rms.py:107-123).
- LayerNorm ``layernorm`` (api.py:1089-1119): out = empty_like(input) (api.py:1114), then
  ``layernorm_cute`` (api.py:1118).
  - dtypes: bfloat16 only ("Need to be bfloat16", api.py:1101; its CUDA kernel checks "input must
    be bfloat16", norm.cu:330).
  - gamma and beta both required, float32 (api.py:1103-1105; norm.cu:331-332): the caller's
    weight and bias are converted to float32 before the timed call (exact); a LayerNorm without
    both is refused.
  - rows: any row stride that is a multiple of its vector (the largest of 8, 4, 2, 1 dividing N
    with 32 or more threads, utils.py:938-966) and a 16-byte aligned start (ln.py:273-290);
    others copied as above.
  - outputs: y only; rounding "once": (x - mean) * rstd * gamma + beta in float32 (ln.py:246);
    variance two-pass about the mean (ln.py:193-221). One row per block of up to 1024 threads
    (utils.py:969-976), the whole row in registers: no N limit in the source.
- backward: none (FlashInfer's norms are inference kernels).
- fused_add_rmsnorm and gemma_rmsnorm are left out: fused_add_rmsnorm (api.py:767-806) adds a
  residual into ``residual`` and writes the norm over ``input``, both in place, so each call needs
  fresh copies of x and a zeroed residual: another operation, timed with copies. gemma_rmsnorm
  (api.py:962-997) computes x * rstd * (1 + w): RMSNorm's y = x * rstd * w would need w - 1 in
  x's dtype, which rounds in float16 and bfloat16; and it runs the same kernel as rmsnorm
  (``rmsnorm_cute`` with weight_bias=1.0, api.py:1017).
- compile key: one compiled kernel per dtype, N, PDL and contiguous or strided rows (the
  ``functools.cache`` of ``_get_compiled_rmsnorm_kernel``, rms.py:1136-1193; rows beyond 2**31
  elements take the strided one, rms.py:1345-1351; M a run-time value), LayerNorm per dtype,
  gamma dtype and N (ln.py:264-307).
- workspace: FlashInfer's own y, the float32 gamma and beta, a row copy where made.
"""
from __future__ import annotations

import math

import torch

from impls.base import NormKernel, NormOutputs, NormSpec, OptionalImport, cuda_present
from impls.registry import register

FLASHINFER_VERSION = "0.7.2.post1"
CUTLASS_DSL_VERSION = "4.7.1"
FLASHINFER = OptionalImport(
    "flashinfer.norm",
    missing=(f"flashinfer not importable: pip install flashinfer-python=={FLASHINFER_VERSION} "
             f"nvidia-cutlass-dsl=={CUTLASS_DSL_VERSION} (see docs/backends.md, Peers)"))


def _norm():
    """flashinfer.norm, or None (FLASHINFER.reason says why)."""
    mods = FLASHINFER.modules()
    return None if mods is None else mods[0]


def availability() -> str | None:
    if _norm() is None:
        return FLASHINFER.reason
    if not cuda_present():
        return "flashinfer needs a CUDA device (its norms are CuTe DSL or CUDA kernels)"
    return None


def vector(n: int, dtype: torch.dtype) -> int:
    """Elements of FlashInfer's widest access for rows of N (16 bytes at most)."""
    return math.gcd(n, 16 // torch.empty((), dtype=dtype).element_size())


def as_flashinfer_takes(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """``t`` where FlashInfer's compiled kernels take it as it is (see the module docstring), else
    a fresh contiguous copy."""
    if t is None:
        return None
    size = t.element_size()
    if t.stride(-1) == 1:
        if t.is_contiguous() and t.data_ptr() % math.gcd(128, n * size) == 0 and t.data_ptr() % 16 == 0:
            return t
        if t.dim() == 2 and t.stride(0) % vector(n, t.dtype) == 0 and t.data_ptr() % 16 == 0:
            return t
    return t.clone(memory_format=torch.contiguous_format)


def _path() -> str:
    """Which of its kernels FlashInfer runs here (its own dispatch, ``_use_cuda_norm``), for the note."""
    use_cuda = getattr(_norm(), "_use_cuda_norm", None)
    if use_cuda is None or not cuda_present():
        return ""
    try:
        return "; CUDA JIT kernels (nvcc)" if use_cuda(torch.device("cuda")) else "; CuTe DSL kernels"
    except Exception as exc:  # noqa: BLE001 (a note: the calls themselves report their errors)
        return f"; kernel path unknown ({type(exc).__name__})"


class _FlashInfer(NormKernel):
    backend = "flashinfer"
    variant = "default"
    packages = ("flashinfer-python", "nvidia-cutlass-dsl")
    devices = ("cuda",)
    outputs = ("y",)
    rounding = "once"

    def availability(self) -> str | None:
        return availability()

    def note(self) -> str:
        import importlib.metadata as md

        found = []
        for pkg in self.packages:
            try:
                found.append(f"{pkg} {md.version(pkg)}")
            except md.PackageNotFoundError:
                found.append(f"{pkg} not installed")
        return f"{', '.join(found)} (written for flashinfer-python {FLASHINFER_VERSION}){_path()}"

    def _inputs(self, x, weight, bias) -> tuple:
        """What FlashInfer's entry point requires of x, weight and bias, made before its call."""
        n = x.shape[-1]
        return as_flashinfer_takes(x, n), as_flashinfer_takes(weight, n), as_flashinfer_takes(bias, n)

    def _entry(self, x, weight, bias, eps: float) -> torch.Tensor:
        raise NotImplementedError

    def _call(self, x, weight, bias, eps):
        return self._entry(*self._inputs(x, weight, bias), eps)

    def bench_callable(self, x, weight, bias, eps, out):
        args = self._inputs(x, weight, bias)
        return lambda: self._entry(*args, eps)

    def user_call(self, x, weight, bias, eps):
        args = self._inputs(x, weight, bias)
        return self.call_name, lambda: self._entry(*args, eps)

    def _forward(self, x, weight, bias, eps, out: NormOutputs) -> None:
        out.y.copy_(self._call(x, weight, bias, eps).view(out.y.shape))

    def compile_key(self, spec: NormSpec):
        compact = (spec.rows <= 1 or spec.row_stride == spec.n) and spec.rows * spec.n < 2**31  # rms.py:1345-1351
        return ("flashinfer", spec.op, spec.dtype, spec.n, compact)

    def prepare(self, spec: NormSpec) -> None:
        """Compile outside any timed region (M is a run-time value: a few rows do)."""
        if self.unsupported(spec):
            return
        rows = min(spec.rows, 8)
        x = torch.randn(rows, spec.row_stride, dtype=spec.dtype, device="cuda")[:, :spec.n]
        w = torch.ones(spec.n, dtype=spec.dtype, device="cuda")
        b = torch.zeros(spec.n, dtype=spec.dtype, device="cuda") if spec.has_bias else None
        self._call(x, w, b, 1e-5)
        torch.cuda.synchronize()

    def workspace_bytes(self, spec: NormSpec) -> int:
        size = torch.empty((), dtype=spec.dtype).element_size()
        e = spec.rows * spec.n
        return 2 * e * size + 8 * spec.n  # its own y, a row copy where made, gamma and beta in float32


@register
class FlashInferRMSNorm(_FlashInfer):
    op = "rms_norm"
    dtypes = (torch.float16, torch.bfloat16)
    call_name = "flashinfer.norm.rmsnorm(x, weight, eps)"

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not spec.has_weight:
            return "flashinfer's rmsnorm needs a weight (no entry point without one)"
        return None

    def _entry(self, x, weight, bias, eps):
        return _norm().rmsnorm(x, weight, eps)


def _f32(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else as_flashinfer_takes(t.float(), n)


@register
class FlashInferLayerNorm(_FlashInfer):
    op = "layer_norm"
    dtypes = (torch.bfloat16,)
    call_name = "flashinfer.norm.layernorm(x, gamma_f32, beta_f32, eps)"

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not (spec.has_weight and spec.has_bias):
            return "flashinfer's layernorm needs both gamma and beta (float32): no entry point without them"
        return None

    def _inputs(self, x, weight, bias):
        n = x.shape[-1]
        return as_flashinfer_takes(x, n), _f32(weight, n), _f32(bias, n)

    def _entry(self, x, weight, bias, eps):
        return _norm().layernorm(x, weight, bias, eps)
