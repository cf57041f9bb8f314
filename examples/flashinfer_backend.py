"""FlashInfer (``pip install flashinfer-python==0.7.2.post1``) as an outside backend, loaded with

    pytest harness --backend-file examples/flashinfer_backend.py --backend flashinfer

It registers backend "flashinfer", variant ``default``: ``flashinfer.norm.rmsnorm(x, weight, eps)``
and ``flashinfer.norm.layernorm(x, gamma, beta, eps)``, the entry points vLLM and SGLang call, on
FlashInfer's default path with its own launch choices (its cluster and vector plan by N) but
programmatic dependent launch: each call that takes ``enable_pdl`` is given the project's switch,
``impls.pdl.enabled(x.device)``, so the benchmarks time FlashInfer with PDL on and off as they do
the project's kernels (those kernels declare ``pdl = True``; a repro passes ``_enable_pdl``, the
same rule without normdiff). FlashInfer's own default (None) is that rule less the switch: PDL
where the GPU has it (api.py:686-687). ``flashinfer`` is imported on first use, so this file
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
  ``rmsnorm_cute`` (api.py:696), launched with PDL as ``enable_pdl`` says (api.py:686-687).
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
  ``layernorm_cute`` (api.py:1118). It takes no ``enable_pdl``: no PDL declared, timed once.
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
- fused_add_rmsnorm and gemma_rmsnorm are not plain norms: fused_add_rmsnorm (api.py:767-806)
  adds a residual into ``residual`` and writes the norm over ``input``, both in place, and
  gemma_rmsnorm (api.py:962-997) computes x * rstd * (1 + w) (RMSNorm's y = x * rstd * w would
  need w - 1 in x's dtype, which rounds in float16 and bfloat16). They, the fp8 outputs and
  layernorm_quant are declared in the fused family (impls.fused), at the end of this file.
- compile key: one compiled kernel per dtype, N, PDL and contiguous or strided rows (the
  ``functools.cache`` of ``_get_compiled_rmsnorm_kernel``, rms.py:1136-1193; rows beyond 2**31
  elements take the strided one, rms.py:1345-1351; M a run-time value), LayerNorm per dtype,
  gamma dtype and N (ln.py:264-307).
- workspace: FlashInfer's own y, the float32 gamma and beta, a row copy where made.
"""
from __future__ import annotations

import functools
import importlib
import math
import os
import shutil

import torch

from impls import pdl
from impls.base import NormKernel, NormOutputs, NormSpec, OptionalImport, ReproCall, UnsupportedCase, cuda_present
from impls.fused import FP8_DTYPES, FusedNormKernel, FusedOutputs, FusedParams
from impls.registry import register
from impls.repro_calls import source_of

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


def _enable_pdl(device) -> bool:
    """``enable_pdl`` in a repro, which runs without normdiff: the rule of ``pdl.enabled``, what the
    plug-in passes (a CUDA device of compute capability 9.0 or more, NORMDIFF_PDL not 0)."""
    device = torch.device(device)
    return (os.environ.get("NORMDIFF_PDL", "1") != "0" and device.type == "cuda"
            and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (9, 0))


def repro_call(kernel) -> ReproCall:
    """A standalone repro (python -m harness.repro): flashinfer.norm called as the plug-in calls it
    (each class's repro_forward), with the helpers that make its layout copied in."""
    helpers = [vector, as_flashinfer_takes, _f32, _misfit, _take_rows, _into, _scale_tensor, _weight16, _enable_pdl]
    return ReproCall(
        imports='import functools\nimport importlib\n\nflashinfer_norm = importlib.import_module("flashinfer.norm")',
        source=REPRO_UNSUPPORTED + "\n\n\n" + source_of(*helpers), forward=kernel.repro_forward,
        requires=f"pip install flashinfer-python=={FLASHINFER_VERSION} nvidia-cutlass-dsl=={CUTLASS_DSL_VERSION}")


REPRO_UNSUPPORTED = ("class UnsupportedCase(RuntimeError):\n"
                     '    """A layout the call does not take as it is (normdiff skips such a case)."""')


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

    repro_call = repro_call
    repro_inputs = "x, weight, bias = as_flashinfer_takes(x, n), as_flashinfer_takes(weight, n), as_flashinfer_takes(bias, n)"
    repro_entry = ""  # _entry on the inputs

    @property
    def repro_forward(self) -> str:
        return f"n = x.shape[-1]\n{self.repro_inputs}\nout.y.copy_({self.repro_entry}.view(out.y.shape))"

    def _inputs(self, x, weight, bias) -> tuple:
        """What FlashInfer's entry point requires of x, weight and bias, made before its call."""
        n = x.shape[-1]
        return as_flashinfer_takes(x, n), as_flashinfer_takes(weight, n), as_flashinfer_takes(bias, n)

    def _entry(self, x, weight, bias, eps: float, enable_pdl: bool) -> torch.Tensor:
        raise NotImplementedError

    def _call(self, x, weight, bias, eps):
        return self._entry(*self._inputs(x, weight, bias), eps, pdl.enabled(x.device))

    # The switch is read once per callable: a benchmark sets it for the whole of its timing.
    def bench_callable(self, x, weight, bias, eps, out):
        args, on = self._inputs(x, weight, bias), pdl.enabled(x.device)
        return lambda: self._entry(*args, eps, on)

    def user_call(self, x, weight, bias, eps):
        args, on = self._inputs(x, weight, bias), pdl.enabled(x.device)
        return self.call_name, lambda: self._entry(*args, eps, on)

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
    pdl = True  # enable_pdl (api.py:686-687)
    call_name = "flashinfer.norm.rmsnorm(x, weight, eps)"

    def unsupported(self, spec: NormSpec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not spec.has_weight:
            return "flashinfer's rmsnorm needs a weight (no entry point without one)"
        return None

    def _entry(self, x, weight, bias, eps, enable_pdl):
        return _norm().rmsnorm(x, weight, eps, enable_pdl=enable_pdl)

    repro_entry = "flashinfer_norm.rmsnorm(x, weight, eps, enable_pdl=_enable_pdl(x.device))"


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

    def _entry(self, x, weight, bias, eps, enable_pdl):  # layernorm takes no enable_pdl
        return _norm().layernorm(x, weight, bias, eps)

    repro_inputs = "x, weight, bias = as_flashinfer_takes(x, n), _f32(weight, n), _f32(bias, n)"
    repro_entry = "flashinfer_norm.layernorm(x, weight, bias, eps)"


# -- the fused family (impls.fused) -----------------------------------------------------------------
# FlashInfer's fused norms, one kernel per public call. Line numbers are of the flashinfer-python
# 0.7.2.post1 wheel, as above, plus: fa.py for flashinfer/norm/kernels/fused_add_rmsnorm.py,
# norm.cuh for flashinfer/data/include/flashinfer/norm.cuh, typeutils.cuh for
# flashinfer/data/include/flashinfer/trtllm/common/cudaTypeUtils.cuh, jit/ for flashinfer/jit/.
# Each call runs its CuTe DSL kernel unless FlashInfer takes its CUDA path (``_use_cuda_norm``,
# api.py:115-127; nvcc-built from norm.cu by ``get_norm_module``, api.py:130-137), except
# layernorm_quant, which has the CUDA path only (api.py:1166-1167).
#
# What every declaration below rests on:
# - the residual add: h = x + residual in float32; residual <- h rounded to its dtype; y from the
#   float32 h, so stats_on "float32_sum" (CuTe: fa.py:381-388, rstd on h fa.py:390-396, y on h
#   fa.py:404-406; CUDA: the float32 sum kept in shared memory, norm.cuh:448-458, y from it,
#   norm.cuh:492-496).
# - the residual is read as x's dtype: the CuTe kernels compile it with x's dtype (fa.py:923-934,
#   :988-1003), and the CUDA binding casts its pointer to x's type with no dtype check (norm.cu:139-143,
#   :174-180; fused_add_rmsnorm_fp8_block_quant checks CHECK_SAME_DTYPE, norm.cu:215): residual
#   "same" only. The weight is compiled with x's dtype as well (fa.py:936, rms.py:1177, :1294).
# - ``scale`` is the dequantisation scale: y is multiplied by its reciprocal, i.e. divided by it
#   (scale_convention "divide"): rcp.approx.ftz in the CuTe kernels (fa.py:577, :735; rms.py:845,
#   :975; utils.py:66-79), 1.0f / scale in the CUDA ones (norm.cuh:229, :616, :989-992) compiled
#   with -use_fast_math (gen_jit_spec's default use_fast_math=True, jit/core.py:708, :746-747), so
#   approximate there too. A float scale is deprecated (api.py:143-151): a float32 tensor of shape
#   (1,) is passed.
# - saturation and NaN (fp8_nan): the CuTe kernels saturate by cvt.rn.satfinite (utils.py:83-104,
#   :197-248), which keeps NaN; their scalar tail clamps first with max/min (fa.py:777-778,
#   rms.py:1017-1018), which the CuTe DSL lowers to NaN-propagating arith.maximumf/minimumf
#   (cutlass/_mlir_helpers/arith.py:1026, :1071 of nvidia-cutlass-dsl 4.7.1): NaN stays NaN, "nan"
#   (sm_89 and later; before, a software convert turns NaN into +-max, utils.py:108-194). The CUDA
#   kernels clamp by fmaxf(-max, fminf(y, max)) (norm.cuh:246, :633): fminf drops the NaN for +max,
#   so NaN becomes +max, "max". layernorm_quant: see its class.
# - eps: a float, float32 in the kernels (fa.py:194, :516; norm.cu takes a double, cast to float).
# - N: no limit on the CuTe DSL path (clusters, as rmsnorm); the CUDA add kernels keep the whole
#   float32 row in shared memory ((N + warps) * 4 bytes, norm.cuh:518, :656), so there rows beyond
#   the GPU's opt-in shared memory (about 57k elements on sm_90) fail to launch: not declared, the
#   default path on sm_90 being the CuTe one.
# - no statistics are returned (outputs y, and residual_out for the add ops); no backward.
#
# Found by reading (each to be confirmed on a GPU before it goes into the project's findings):
# - fused_add_rmsnorm_quant's docstring (api.py:835-838) says Step 2 writes ``input[i]``; its kernels
#   write only ``out`` and ``residual`` (CuTe fa.py:714-717 and the fp8 stores :747-884; CUDA
#   norm.cuh:588-591, :635-637), as its op registration says (mutates_args=("out", "residual"),
#   api.py:821): input is left as it was.
# - fused_add_rmsnorm's, gemma_fused_add_rmsnorm's and fused_add_rmsnorm_quant's docstrings
#   (api.py:782, :1050, :838) normalise ``residual[i]`` after ``residual[i] += input[i]``, i.e. the
#   sum rounded to residual's dtype; the kernels normalise the float32 sum (above).
# - rmsnorm_quant's docstring formula (api.py:724) has no scale; the kernels divide by it (above).
# - the CUDA fused_add_rmsnorm / gemma_fused_add_rmsnorm / fused_add_rmsnorm_quant bindings take a
#   residual of another dtype without a check and read its bytes as x's type (norm.cu:121-187).
# - the CUDA kernels' "1.0f / scale" is approximate under the module's -use_fast_math (above).
# - layernorm_quant: see its class.
_JIT_SOURCES_MISSING = ("flashinfer builds {call} only by its nvcc JIT, from flashinfer/data/csrc/norm.cu "
                        "(jit/norm.py:21-33), which is not installed here (tools/pack_peer_wheels.sh leaves "
                        "flashinfer/data out of the GPU machine's pack)")


def _cuda_jit() -> bool:
    """Whether FlashInfer's norms take its nvcc-built CUDA kernels here (its own dispatch)."""
    use_cuda = getattr(_norm(), "_use_cuda_norm", None)
    if use_cuda is None or not cuda_present():
        return False
    try:
        return bool(use_cuda(torch.device("cuda")))
    except Exception:  # noqa: BLE001 (FlashInfer's own probe; the call reports its errors)
        return False


@functools.cache
def jit_unbuildable(call: str) -> str | None:
    """Why FlashInfer cannot give its CUDA norm module here, else None: no prebuilt module
    (``is_aot``, jit/core.py:500), and its nvcc JIT lacks norm.cu (jit/env.py:400) or nvcc
    (FLASHINFER_NVCC, else CUDA_HOME's, jit/core.py:658 and jit/cpp_ext.py:48-64)."""
    try:
        jit_norm = importlib.import_module("flashinfer.jit.norm")
        jit_env = importlib.import_module("flashinfer.jit.env")
        if getattr(jit_norm.gen_norm_module(), "is_aot", False):
            return None
        sources = jit_env.FLASHINFER_CSRC_DIR
    except Exception as exc:  # noqa: BLE001 (a reason to report, not a crash)
        return f"flashinfer's JIT for {call} cannot start here [{type(exc).__name__}: {str(exc).strip()[:160]}]"
    if not (sources / "norm.cu").is_file():
        return _JIT_SOURCES_MISSING.format(call=call)
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.environ.get("FLASHINFER_NVCC") or (f"{home}/bin/nvcc" if home else shutil.which("nvcc"))
    if not nvcc or not os.path.isfile(nvcc):
        return f"flashinfer builds {call} with nvcc, which is not found here (FLASHINFER_NVCC, CUDA_HOME or PATH)"
    return None


@functools.cache
def _scale_tensor(scale: float, device: str) -> torch.Tensor:
    """The fp8 scale as FlashInfer takes it: float32, shape (1,), on x's device (api.py:140-170)."""
    return torch.tensor([scale], dtype=torch.float32, device=device)


def _misfit(named: list, n: int, dtype: torch.dtype) -> tuple[int, str] | None:
    """(index, why) of the first tensor FlashInfer's compiled kernels would not take as it is, else
    None. Where every tensor of the call is contiguous (and M * N < 2**31) they run a compact
    kernel that assumes starts aligned to gcd(128, N * element bytes); else a strided one that
    assumes 16-byte starts and row strides a multiple of x's vector (fa.py:917-934, :979-1003,
    :1051-1055; rms.py:1276-1292). The compiled function checks the alignment at each call and
    raises ValueError (nvidia-cutlass-dsl 4.7.1, base_dsl/tvm_ffi_builder/tvm_ffi_builder.py:2197-2216)."""
    rows = named[0][1].shape[0]
    compact = all(t.is_contiguous() for _, t in named) and rows * n <= 2**31 - 1
    v = vector(n, dtype)
    for i, (label, t) in enumerate(named):
        if compact:
            align = math.gcd(128, n * t.element_size())
            if t.data_ptr() % align:
                return i, (f"{label} starts {t.data_ptr() % align} bytes past a {align}-byte boundary: flashinfer's "
                           f"compact kernel assumes {align}-byte aligned rows")
        elif t.data_ptr() % 16 or (t.shape[0] > 1 and t.stride(0) % v):
            return i, (f"{label}'s rows (start {t.data_ptr() % 16} bytes past 16, stride {t.stride(0)}) are not what "
                       f"flashinfer's strided kernel assumes: 16-byte aligned starts, strides a multiple of {v}")
    return None


def _take_rows(n: int, dtype: torch.dtype, read: dict, in_place: dict, y: torch.Tensor | None = None):
    """(the inputs FlashInfer only reads, the buffer it is to write y into) as its kernels take
    them: read inputs copied to fresh contiguous rows, and y given a fresh buffer (its caller then
    copies it into ``y``), where they would not be taken as they are. What it writes in place (x,
    residual) must fit as it is, else UnsupportedCase: a copy would not be the call."""
    target = y
    for _ in range(3):
        named = list(read.items()) + list(in_place.items()) + ([("out.y", target)] if target is not None else [])
        bad = _misfit(named, n, dtype)
        if bad is None:
            return read, target
        index, why = bad
        if len(read) <= index < len(read) + len(in_place):
            raise UnsupportedCase(why)
        if index < len(read):
            read = {k: t.clone(memory_format=torch.contiguous_format) for k, t in read.items()}
        else:
            target = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    raise UnsupportedCase(why)


def _into(y: torch.Tensor, written: torch.Tensor) -> None:
    if written is not y:
        y.copy_(written)


def _weight16(weight: torch.Tensor) -> torch.Tensor:
    return weight if weight.data_ptr() % 16 == 0 else weight.clone()  # compiled 16-byte aligned (fa.py:936)


class _FlashInferFused(FusedNormKernel):
    backend = "flashinfer"
    packages = ("flashinfer-python", "nvidia-cutlass-dsl")
    devices = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16)  # the CUDA path dispatches these two (norm.cu:139, :174, :272, :301)
    outputs = ("y",)
    rounding = "once"
    entry = ""  # flashinfer.norm's function
    jit_only = False  # layernorm_quant: no CuTe DSL kernel

    note = _FlashInfer.note
    repro_call = repro_call

    def availability(self) -> str | None:
        reason = availability()
        if reason is None and (self.jit_only or _cuda_jit()):
            reason = jit_unbuildable(self.entry)
        return reason

    def unsupported(self, spec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not spec.has_weight:
            return f"flashinfer's {self.entry} needs a weight (no entry point without one)"
        return None

    def _weight(self, weight: torch.Tensor) -> torch.Tensor:
        return _weight16(weight)


class _FlashInferFp8(_FlashInferFused):
    out_dtypes = FP8_DTYPES
    scale_convention = "divide"

    @property
    def fp8_nan(self) -> str:
        """NaN stays NaN on the CuTe DSL path, becomes +max on the CUDA path (see the notes above)."""
        return "max" if _cuda_jit() else "nan"


class _FlashInferAddInPlace(_FlashInferFused):
    op = "add_rms_norm"
    outputs = ("y", "residual_out")
    writes = ("in_place",)  # residual += x, then x = norm(residual) * w: both in place (api.py:768)
    stats_on = "float32_sum"
    pdl = True  # enable_pdl

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        _take_rows(x.shape[-1], x.dtype, {}, {"x": x, "residual": residual})  # both written in place
        getattr(_norm(), self.entry)(x, residual, self._weight(weight), eps, enable_pdl=pdl.enabled(x.device))

    def bench_fused_callable(self, x, residual, weight, bias, eps, params, out):
        """The library's call alone (the benchmark's rows fit its layout, checked once here)."""
        _take_rows(x.shape[-1], x.dtype, {}, {"x": x, "residual": residual})
        fn, w, on = getattr(_norm(), self.entry), self._weight(weight), pdl.enabled(x.device)
        return lambda: fn(x, residual, w, eps, enable_pdl=on)

    @property
    def repro_forward(self) -> str:
        return ('_take_rows(x.shape[-1], x.dtype, {}, {"x": x, "residual": residual})  # both written in place\n'
                f"flashinfer_norm.{self.entry}(x, residual, _weight16(weight), eps, enable_pdl=_enable_pdl(x.device))")


@register
class FlashInferFusedAddRMSNorm(_FlashInferAddInPlace):
    variant = "fused_add"
    entry = "fused_add_rmsnorm"
    call_name = "flashinfer.norm.fused_add_rmsnorm(x, residual, weight, eps)"
    source = ("flashinfer/norm/__init__.py:767-806 (in place, mutates_args=('input', 'residual') :768); "
              "flashinfer/norm/kernels/fused_add_rmsnorm.py:381-411, :896-952, :1032-1065 (CuTe DSL); "
              "flashinfer/data/include/flashinfer/norm.cuh:415-543, flashinfer/data/csrc/norm.cu:121-149 (CUDA)")


@register
class FlashInferGemmaFusedAddRMSNorm(_FlashInferAddInPlace):
    variant = "gemma_fused_add"
    entry = "gemma_fused_add_rmsnorm"
    weight_offsets = (1.0,)  # (w + 1) in float32: weight_bias=1.0 (api.py:1073-1075; norm.cuh:866, :496)
    call_name = "flashinfer.norm.gemma_fused_add_rmsnorm(x, residual, weight, eps)"
    source = ("flashinfer/norm/__init__.py:1033-1076 (in place, mutates_args=('input', 'residual') :1035); "
              "flashinfer/norm/kernels/fused_add_rmsnorm.py:404-411 (weight_bias); "
              "flashinfer/data/include/flashinfer/norm.cuh:854-890, flashinfer/data/csrc/norm.cu:283-310 (CUDA)")


@register
class FlashInferFusedAddRMSNormQuant(_FlashInferFp8):
    op = "add_rms_norm"
    variant = "fused_add_quant"
    outputs = ("y", "residual_out")
    # The fp8 y into the caller's ``out``, residual += x in place; x is only read (the docstring's
    # "input[i] = ..." at api.py:838 is not what the kernels do: see the notes above).
    writes = ("out_y",)
    stats_on = "float32_sum"
    pdl = True  # enable_pdl
    entry = "fused_add_rmsnorm_quant"
    call_name = "flashinfer.norm.fused_add_rmsnorm_quant(out, x, residual, weight, scale, eps)"
    source = ("flashinfer/norm/__init__.py:819-877 (mutates_args=('out', 'residual') :821); "
              "flashinfer/norm/kernels/fused_add_rmsnorm.py:423-888 (inv_scale :577, y :735, satfinite stores "
              ":747-884), :955-1024, :1068-1116 (CuTe DSL); flashinfer/data/include/flashinfer/norm.cuh:545-680 "
              "(1.0f / scale :616, fmaxf(-max, fminf(y, max)) :633), flashinfer/data/csrc/norm.cu:151-187 (CUDA)")

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {"residual": residual}, out.y)
        _norm().fused_add_rmsnorm_quant(y, read["x"], residual, self._weight(weight),
                                        _scale_tensor(float(params.scale), str(x.device)), eps,
                                        enable_pdl=pdl.enabled(x.device))
        _into(out.y, y)

    def bench_fused_callable(self, x, residual, weight, bias, eps, params, out):
        """The library's call alone, its scale tensor made once (a model keeps it on the device)."""
        read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {"residual": residual}, out.y)
        fn, w, scale = _norm().fused_add_rmsnorm_quant, self._weight(weight), _scale_tensor(float(params.scale), str(x.device))
        on = pdl.enabled(x.device)
        return lambda: fn(y, read["x"], residual, w, scale, eps, enable_pdl=on)

    repro_forward = """
read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {"residual": residual}, out.y)
flashinfer_norm.fused_add_rmsnorm_quant(y, read["x"], residual, _weight16(weight),
                                        _scale_tensor(float(params.scale), str(x.device)), eps,
                                        enable_pdl=_enable_pdl(x.device))
_into(out.y, y)
"""


@register
class FlashInferGemmaRMSNorm(_FlashInferFused):
    op = "rms_norm"
    variant = "gemma"
    weight_offsets = (1.0,)  # x * rstd * (w + 1), w + 1 in float32 (api.py:972, :1017-1018; rms.py:406)
    pdl = True  # enable_pdl
    entry = "gemma_rmsnorm"
    call_name = "flashinfer.norm.gemma_rmsnorm(x, weight, eps, out=out)"
    source = ("flashinfer/norm/__init__.py:962-1020 (rmsnorm_cute with weight_bias=1.0 :1017-1018); "
              "flashinfer/norm/kernels/rmsnorm.py:406, :1320-1360 (CuTe DSL); "
              "flashinfer/data/include/flashinfer/norm.cuh:819-852, flashinfer/data/csrc/norm.cu:257-281 (CUDA)")

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {}, out.y)
        _norm().gemma_rmsnorm(read["x"], self._weight(weight), eps, out=y, enable_pdl=pdl.enabled(x.device))
        _into(out.y, y)

    def bench_fused_callable(self, x, residual, weight, bias, eps, params, out):
        read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {}, out.y)
        fn, w, on = _norm().gemma_rmsnorm, self._weight(weight), pdl.enabled(x.device)
        return lambda: fn(read["x"], w, eps, out=y, enable_pdl=on)

    repro_forward = """
read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {}, out.y)
flashinfer_norm.gemma_rmsnorm(read["x"], _weight16(weight), eps, out=y, enable_pdl=_enable_pdl(x.device))
_into(out.y, y)
"""


@register
class FlashInferRMSNormQuant(_FlashInferFp8):
    op = "rms_norm"
    variant = "quant"
    pdl = True  # enable_pdl
    entry = "rmsnorm_quant"
    call_name = "flashinfer.norm.rmsnorm_quant(out, x, weight, scale, eps)"
    source = ("flashinfer/norm/__init__.py:712-753 (mutates_args=('out',) :713; its formula :724 omits the "
              "scale); flashinfer/norm/kernels/rmsnorm.py:706-1128 (inv_scale :845, y :975, clamp :1017-1018), "
              ":1251-1317, :1390-1425 (CuTe DSL); flashinfer/data/include/flashinfer/norm.cuh:174-290 "
              "(1.0f / scale :229, fmaxf(-max, fminf(y, max)) :246), flashinfer/data/csrc/norm.cu:82-119 (CUDA)")

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {}, out.y)
        _norm().rmsnorm_quant(y, read["x"], self._weight(weight), _scale_tensor(float(params.scale), str(x.device)),
                              eps, enable_pdl=pdl.enabled(x.device))
        _into(out.y, y)

    def bench_fused_callable(self, x, residual, weight, bias, eps, params, out):
        """The library's call alone, its scale tensor made once (a model keeps it on the device)."""
        read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {}, out.y)
        fn, w, scale = _norm().rmsnorm_quant, self._weight(weight), _scale_tensor(float(params.scale), str(x.device))
        on = pdl.enabled(x.device)
        return lambda: fn(y, read["x"], w, scale, eps, enable_pdl=on)

    repro_forward = """
read, y = _take_rows(x.shape[-1], x.dtype, {"x": x}, {}, out.y)
flashinfer_norm.rmsnorm_quant(y, read["x"], _weight16(weight), _scale_tensor(float(params.scale), str(x.device)), eps,
                              enable_pdl=_enable_pdl(x.device))
_into(out.y, y)
"""


@register
class FlashInferLayerNormQuant(_FlashInferFp8):
    """layernorm_quant: the CUDA path only ("No CuTe-DSL layernorm quant kernel yet", api.py:1166),
    so it needs the nvcc JIT and norm.cu, which the GPU machine's pack leaves out: skipped there
    with that reason (``jit_unbuildable``).

    - dtypes: bfloat16 x, float32 gamma, beta and scale (norm.cu:369-373; the caller's weight and
      bias go as float32, exact); gamma and beta both required (tensors, not optional, norm.cu:345-360).
    - rows: x and out with a row stride of N (norm.cu:366-368: the kernel takes no strides): x is
      copied to such rows where it is not, and y written into a fresh buffer and copied into the
      caller's out where that is not.
    - math (norm.cuh:902-1049 through LayerNormQuant :1140-1181): the mean, then the variance two-
      pass about it (:939-983), rsqrtf; y = (x - mean) * rstd * gamma + beta in float32, then
      **rounded to x's dtype** (bfloat16, :999), then times 1.0f / scale (:989-992, :1010) and cast
      with satfinite (typeutils.cuh:593-600). The docstring's formula (api.py:1145, :1160-1161) has
      no such rounding, and typeutils.cuh:595-596 says an intermediate bf16 step is what the direct
      cast avoids: to be confirmed on a GPU (an fp8 ulp where the bfloat16 rounding crosses an fp8
      rounding boundary).
    - NaN: before the cast it clamps to [-FLT_MAX, FLT_MAX] in x's dtype (:915-916, :1008), with
      cuda_clamp = cuda_min(cuda_max(v, lo), hi) (typeutils.cuh:576-580), whose max drops a NaN
      for the lower bound (__hmax2 on bfloat162, :545-547; ``v > lo ? v : lo`` on one bfloat16,
      :525-528): NaN becomes -FLT_MAX (bfloat16 rounds it to -inf), times 1 / scale, saturated:
      -max ("-max"). LayerNormQuant passes no clamp (clamp_ptr = nullptr, :1159; "no extra clamp
      is needed", :1155-1156), yet generalLayerNorm clamps to its default bounds all the same,
      which is what turns NaN into -max.
    """

    op = "layer_norm"
    variant = "layernorm_quant"
    dtypes = (torch.bfloat16,)
    jit_only = True  # and no enable_pdl: no PDL declared
    entry = "layernorm_quant"
    call_name = "flashinfer.norm.layernorm_quant(out, x, gamma_f32, beta_f32, scale, eps)"
    source = ("flashinfer/norm/__init__.py:1133-1167 (CUDA JIT only :1166-1167); flashinfer/data/csrc/norm.cu:345-392; "
              "flashinfer/data/include/flashinfer/norm.cuh:902-1049 (rounded to x's dtype :999, clamp :1008, "
              "1.0f / scale :989-992), :1140-1181; flashinfer/data/include/flashinfer/trtllm/common/"
              "cudaTypeUtils.cuh:525-580, :593-600; flashinfer/jit/norm.py:21-33")

    @property
    def fp8_nan(self) -> str:
        return "-max"

    def unsupported(self, spec) -> str | None:
        reason = super().unsupported(spec)
        if reason:
            return reason
        if not spec.has_bias:
            return "flashinfer's layernorm_quant needs both gamma and beta (float32): no entry point without them"
        return None

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        n = x.shape[-1]
        dense = lambda t: t if t.stride(0) == n else t.clone(memory_format=torch.contiguous_format)  # noqa: E731
        y = out.y if out.y.stride(0) == n else torch.empty(out.y.shape, dtype=out.y.dtype, device=out.y.device)
        _norm().layernorm_quant(y, dense(x), _f32(weight, n), _f32(bias, n),
                                _scale_tensor(float(params.scale), str(x.device)), eps)
        _into(out.y, y)

    repro_forward = """
n = x.shape[-1]
dense = lambda t: t if t.stride(0) == n else t.clone(memory_format=torch.contiguous_format)  # noqa: E731
y = out.y if out.y.stride(0) == n else torch.empty(out.y.shape, dtype=out.y.dtype, device=out.y.device)
flashinfer_norm.layernorm_quant(y, dense(x), _f32(weight, n), _f32(bias, n),
                                _scale_tensor(float(params.scale), str(x.device)), eps)
_into(out.y, y)
"""
