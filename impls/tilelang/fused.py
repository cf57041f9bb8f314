"""The fused norms in TileLang (impls.fused): add_rms_norm, add_layer_norm, and rms_norm /
layer_norm with Gemma's weight offset (RMSNorm) or an fp8 output, as ``tilelang.fused``.

One program (_fused_programs.fused_norm) for every op, dtype and write convention: x + residual
in float32, the statistics on that float32 sum, y from it, residual_out rounded once to the
residual's dtype. Rows up to ONE_READ_MAX_N are read once and held in registers; longer rows
are read twice in segments (any N). Forward only. M and the row strides are run-time values:
one compilation per plan (op, dtype, residual dtype, output dtype, offset, N, affine, vector
width). Without a CUDA device the kernels compile for sm_90 (``offline_builds``) but never run.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

from impls.base import UnsupportedCase, cuda_present, dtype_name
from impls.fused import ADD_OPS, BASE_OP, WRITES, FusedNormKernel, FusedOutputs, FusedParams, fp8_max
from impls.gpu_limits import SM_REGISTERS, SM_THREADS, cdiv, next_pow2
from impls.registry import register
from impls.tilelang import compiler
from impls.tilelang._kernel import TileLangBackend, _align_offset, _dummy
from impls.tilelang.plan import MAX_THREADS, MIN_BLOCK_THREADS, SPLITK_THREADS, Plan, choose_vec

FUSED_VARIANT = "fused"  # _fused_programs' builder key
# Rows read once (held in registers) up to this N, 32 float32 values a thread at 512 threads;
# longer rows take the two-read program. At the fragment kernel's 32768 (64 values) add_layer_norm
# spilled (128 registers, the most 512 threads may have).
ONE_READ_MAX_N = 16384
# Vectors a thread holds in the one-read program (2 for short rows), as layer_norm_fwd; in each
# segment of the two-read program (half splitk's: the segment is float32 here, and with 4 the
# add ops took 123-132 registers, one block of 256 threads per SM).
VECTORS, SHORT_VECTORS, SHORT_N, SEGMENT_VECTORS = 4, 2, 2048, 2
# The fp8 outputs: torch's dtype -> TileLang's name.
FP8_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def min_blocks_per_sm(threads: int, values: int, extra: int = 32) -> int:
    """The launch bound (blocks per SM) that holds ptxas near 2 registers per float32 value a
    thread holds plus ``extra``: under TileLang's default bound of one block it took 119 registers
    for 32 values (add_layer_norm), 4 blocks of 128 threads per SM. The two-read program's extra
    is 48 (its running statistics: at 32, add_layer_norm spilled 4 bytes)."""
    budget = -(-(2 * values + extra) // 8) * 8
    return max(1, min(SM_THREADS // threads, SM_REGISTERS // (threads * budget)))


@dataclass(frozen=True)
class FusedPlan(Plan):
    """A fused kernel's plan: the op and what it adds to the plain plan. ``residual_dtype`` None:
    no residual; ``out_dtype`` None: y in x's dtype; ``segments`` 1: the row read once."""

    op: str = "add_rms_norm"
    residual_dtype: str | None = None
    out_dtype: str | None = None
    weight_offset: float = 0.0
    segments: int = 1

    @property
    def layer_norm(self) -> bool:
        return BASE_OP[self.op] == "layer_norm"

    @property
    def fp8_max(self) -> float:
        return fp8_max(getattr(torch, self.out_dtype))

    def describe(self) -> str:
        extras = [f"residual {self.residual_dtype}" if self.residual_dtype else "",
                  f"weight + {self.weight_offset:g}" if self.weight_offset else "",
                  f"y {self.out_dtype}" if self.out_dtype else "",
                  "one read" if self.segments == 1 else f"two reads, {self.segments} segments"]
        return super().describe().replace("tilelang.fused", f"tilelang.fused {self.op}", 1).replace(
            "; vec", "; " + ", ".join(e for e in extras if e) + "; vec", 1)


def fused_plan(op: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
               residual_dtype: str | None = None, out_dtype: str | None = None,
               weight_offset: float = 0.0) -> FusedPlan:
    """One plan for every M (no decode plans): a row's bits never depend on what shares the call."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    common = dict(op=op, residual_dtype=residual_dtype, out_dtype=out_dtype, weight_offset=float(weight_offset))
    if n <= ONE_READ_MAX_N:
        per_thread = VECTORS if n > SHORT_N else SHORT_VECTORS
        tpr = min(MAX_THREADS, max(32, next_pow2(cdiv(cdiv(n, vec), per_thread))))
        padded = cdiv(n, tpr * vec) * tpr * vec
        rows = max(1, MIN_BLOCK_THREADS // tpr)
        return FusedPlan(FUSED_VARIANT, dt, n, has_weight, has_bias, vec, tpr, rows, padded,
                         min_blocks_per_sm(tpr * rows, padded // tpr), **common)
    seg = SPLITK_THREADS * vec * SEGMENT_VECTORS
    return FusedPlan(FUSED_VARIANT, dt, n, has_weight, has_bias, vec, SPLITK_THREADS, 1, seg,
                     min_blocks_per_sm(SPLITK_THREADS, vec * SEGMENT_VECTORS, 48), segments=cdiv(n, seg), **common)


def _compile(plan: FusedPlan, target: dict | None = None) -> compiler.Compiled:
    from impls.tilelang import _fused_programs  # noqa: F401  (adds the builder; imports tilelang)

    return compiler.compile_plan(plan, target)


def _flat(t: torch.Tensor) -> torch.Tensor:
    m, n = t.shape
    return t.as_strided(((m - 1) * t.stride(0) + n,), (1,))


class _TileLangFused(TileLangBackend, FusedNormKernel):
    variant = FUSED_VARIANT
    writes = WRITES
    stats_on = "float32_sum"
    residual_dtypes = ("same", "float32")
    scale_convention = "divide"
    fp8_nan = "nan"  # the clamp compares (NaN passes through), and cvt.satfinite keeps NaN
    batch_invariant = True  # one plan for every M; each row reduced by its own threads
    source = "impls/tilelang/_fused_programs.py"

    def unsupported(self, spec) -> str | None:
        return self.beyond_grid(spec) or super().unsupported(spec)  # the grid's limit holds on any machine

    # -- planning and compiling ----------------------------------------------------------
    def plan_for(self, dtype, n: int, has_weight: bool, has_bias: bool, vec: int, residual_dtype=None,
                 out_dtype=None, weight_offset: float = 0.0) -> FusedPlan:
        if self.op in ADD_OPS and residual_dtype is None:
            residual_dtype = dtype
        name = lambda d: None if d is None else (d if isinstance(d, str) else dtype_name(d))  # noqa: E731
        out = FP8_NAMES.get(out_dtype, out_dtype) if out_dtype is not None else None
        return fused_plan(self.op, dtype, n, has_weight, has_bias and self.op != "rms_norm", vec,
                          name(residual_dtype) if self.op in ADD_OPS else None, name(out), weight_offset)

    def _spec_plan(self, spec) -> FusedPlan:
        """The plan of a problem with contiguous, 16-byte aligned tensors (the harness's)."""
        strides = (spec.row_stride, spec.n) if spec.rows > 1 else ()
        return self.plan_for(spec.dtype, spec.n, spec.has_weight, spec.has_bias,
                             choose_vec(spec.dtype, spec.n, strides), getattr(spec, "residual_dtype", None),
                             getattr(spec, "out_dtype", None), getattr(spec, "weight_offset", 0.0))

    def prepare(self, spec) -> None:
        """Compile (or load from TileLang's disk cache) ahead of a timed region."""
        _compile(self._spec_plan(spec))

    def compile_key(self, spec):
        return self._spec_plan(spec)

    def offline_builds(self) -> tuple:
        """(dtype, N, residual, out dtype, weight offset, write) built for sm_90 on any machine:
        a power of two in every dtype, an odd N (scalar accesses), the one-read capacity edge, long
        rows (two reads, an odd N among them), and the op's own: a float32 residual, fp8 output,
        offset 1, in place (the same program as "new": the build checks that it reads before it
        writes)."""
        add = self.op in ADD_OPS
        r = "same" if add else None
        b = [(dt, 4096, r, None, 0.0, "new") for dt in ("float32", "float16", "bfloat16")]
        b += [("bfloat16", 769, r, None, 0.0, "new"), ("bfloat16", ONE_READ_MAX_N, r, None, 0.0, "new"),
              ("bfloat16", 65536, r, None, 0.0, "new"), ("float32", 100001, r, None, 0.0, "new")]
        if add:
            b += [("bfloat16", 4096, "float32", None, 0.0, "new"), ("bfloat16", 4096, r, None, 0.0, "in_place"),
                  ("bfloat16", 65536, r, None, 0.0, "in_place")]
        if torch.float8_e4m3fn in self.out_dtypes:
            b += [("bfloat16", 4096, r, "float8_e4m3fn", 0.0, "new"), ("float16", 5000, r, "float8_e4m3fn", 0.0, "new"),
                  ("bfloat16", 65536, r, "float8_e4m3fn", 0.0, "new"), ("float32", 4096, r, "float8_e5m2", 0.0, "new")]
        if 1.0 in self.weight_offsets:
            b += [("bfloat16", 4096, r, None, 1.0, "new")]
        return tuple(b)

    def build_plan(self, build) -> FusedPlan:
        dtype, n, residual, out, offset, _write = build
        dt = getattr(torch, dtype)
        rdt = None if residual is None else (dtype if residual == "same" else residual)
        return self.plan_for(dt, n, True, BASE_OP[self.op] == "layer_norm", choose_vec(dt, n), rdt, out, offset)

    def build_offline(self, build) -> dict:
        self.offline_tools()
        plan = self.build_plan(build)
        t0 = time.perf_counter()
        compiled = _compile(plan, compiler.SM90)
        seconds = time.perf_counter() - t0
        if build[-1] == "in_place":
            bad = stores_before_loads(compiled.source())
            if bad:
                raise AssertionError(f"{plan.describe()} in place: a store before the loads of its row: {bad}")
        dtype, n, residual, out, offset, write = build
        return {"dtype": dtype, "n": n, "residual": residual, "out_dtype": out, "weight_offset": offset,
                "write": write, "vec": plan.vec, "threads": plan.threads, "segments": plan.segments,
                "seconds": round(seconds, 2),
                "executed": cuda_present() and compiler.default_target() == compiler.SM90,
                **compiler.ptxas_report(compiled).to_dict()}

    # -- the call ------------------------------------------------------------------------
    def _forward(self, x, residual, weight, bias, eps: float, params: FusedParams, out: FusedOutputs) -> None:
        m, n = x.shape
        rows = [x, out.y] + ([residual, out.residual_out] if residual is not None else [])
        strides = tuple(t.stride(0) for t in rows) if m > 1 else ()
        vec = choose_vec(x.dtype, n, strides, tuple(_align_offset(t) for t in (*rows, weight, bias)))
        plan = self.plan_for(x.dtype, n, weight is not None, bias is not None, vec,
                             None if residual is None else residual.dtype, params.out_dtype, params.weight_offset)
        compiled = _compile(plan)
        step = lambda t: t.stride(0) // vec if m > 1 else 0  # noqa: E731  (row strides in vectors)
        dummy = _dummy(x.device, x.dtype)
        ln = plan.layer_norm
        args = [_flat(x)]
        if residual is not None:
            args.append(_flat(residual))
        args.append(dummy if weight is None else weight)
        if ln:
            args.append(dummy if bias is None else bias)
        args.append(_flat(out.y))
        if residual is not None:
            args.append(_flat(out.residual_out))
        if ln:
            args.append(out.mean)
        args.append(out.rstd)
        args += [step(x)] + ([step(residual)] if residual is not None else []) + [step(out.y)]
        args += [step(out.residual_out)] if residual is not None else []
        args += [float(eps), float(params.scale) if params.out_dtype is not None else 1.0]
        with torch.cuda.device(x.device):
            compiled.kernel(*args)


def stores_before_loads(source: str) -> str | None:
    """The first global store of y or residual_out in a generated kernel's text that comes before
    a load of x or residual, else None. In place, a program must read its row before writing it:
    in the text of the one-read program, every load before every store; in the two-read program's
    second pass, a segment's loads before its stores (the passes are loops, not unrolled in the
    source)."""
    body = source[source.index("main_kernel("):]
    body = body[body.index("{"):]
    lines = body.splitlines()
    loads = [i for i, line in enumerate(lines) if _LOAD.search(line.partition(" = ")[2])]
    for i, line in enumerate(lines):
        if _STORE.search(line.partition(" = ")[0]) and loads and i < loads[-1]:
            return line.strip()
    return None


# A global access of x or residual (a load, right of "=") or of y or residual_out (a store, left
# of it): the flat buffer indexed, or offset and cast for a vector access.
_LOAD = re.compile(r"\b(X|R)\s*(\[|\+)")
_STORE = re.compile(r"\b(Y|RO)\s*(\[|\+)")


@register
class TileLangAddRMSNorm(_TileLangFused):
    op = "add_rms_norm"
    outputs = ("y", "residual_out", "rstd")
    weight_offsets = (0.0, 1.0)
    out_dtypes = (None, *FP8_NAMES)


@register
class TileLangAddLayerNorm(_TileLangFused):
    op = "add_layer_norm"
    outputs = ("y", "residual_out", "mean", "rstd")


@register
class TileLangRMSNormFused(_TileLangFused):
    """rms_norm with Gemma's offset or an fp8 output."""

    op = "rms_norm"
    outputs = ("y", "rstd")
    writes = ("new",)
    weight_offsets = (0.0, 1.0)
    out_dtypes = (None, *FP8_NAMES)


@register
class TileLangLayerNormFused(_TileLangFused):
    """layer_norm with an fp8 output."""

    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    writes = ("new",)
    out_dtypes = (None, *FP8_NAMES)
