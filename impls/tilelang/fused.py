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

import dataclasses
import re
import time

import torch

from impls.base import UnsupportedCase, cuda_present, dtype_name
from impls.fused import ADD_OPS, BASE_OP, WRITES, FusedNormKernel, FusedOutputs, FusedParams
from impls.registry import register
from impls.tilelang import compiler
# The plans and the fp8 settings (FP8_SCALES: a probe's choices) are part of this interface.
from impls.tilelang._fused_plan import (FP8_NAMES, FP8_SCALE, FP8_SCALES, FUSED_VARIANT, ONE_READ_MAX_N,  # noqa: F401
                                        FusedPlan, choose_out_vec, fp8_scale_argument, fused_plan)
from impls.tilelang._kernel import TileLangBackend, _align_offset, _dummy
from impls.tilelang.plan import DECODE_MAX_ROWS, choose_vec


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
    # Each row reduced by its own threads, as many and in the same order at every M: the decode
    # rule (few rows) changes only the rows a block takes, the launch bound and PDL (m_thresholds).
    batch_invariant = True
    # Few rows read once launch with PDL where it runs (impls.pdl; fused_plan's decode rule).
    pdl = True
    pdl_max_rows = DECODE_MAX_ROWS
    source = "impls/tilelang/_fused_programs.py"
    # fused_plan's keyword settings over the rules for every plan this kernel makes: out_vec (the
    # widest an fp8 y may take; narrower where its layout needs), fp8_scale, threads_per_row,
    # min_blocks, pdl (over the switch: True compiles the PDL form, which needs sm_90). Empty for
    # the registered kernels; a probe sets them on an instance of its own.
    plan_settings: dict = {}

    def unsupported(self, spec) -> str | None:
        return self.beyond_grid(spec) or super().unsupported(spec)  # the grid's limit holds on any machine

    # -- planning and compiling ----------------------------------------------------------
    def plan_for(self, dtype, n: int, has_weight: bool, has_bias: bool, vec: int, residual_dtype=None,
                 out_dtype=None, weight_offset: float = 0.0, m: int | None = None, device=None,
                 out_vec: int | None = None) -> FusedPlan:
        """The plan for M rows (None: many) on ``device``: PDL where few rows launch with it there
        (None: no PDL); ``out_vec``: the widest an fp8 y's layout allows (None: a contiguous,
        aligned y's); ``plan_settings`` over all."""
        if self.op in ADD_OPS and residual_dtype is None:
            residual_dtype = dtype
        name = lambda d: None if d is None else (d if isinstance(d, str) else dtype_name(d))  # noqa: E731
        out = FP8_NAMES.get(out_dtype, out_dtype) if out_dtype is not None else None
        settings = dict(self.plan_settings)
        use_pdl = settings.pop("pdl", None)
        if use_pdl is None:
            use_pdl = m is not None and device is not None and self.launches_pdl(device, m)
        widest = settings.pop("out_vec", None)
        if out_dtype is not None:
            out_vec = min(v for v in (out_vec, widest, choose_out_vec(n)) if v)
        return fused_plan(self.op, dtype, n, has_weight, has_bias and self.op != "rms_norm", vec,
                          name(residual_dtype) if self.op in ADD_OPS else None, name(out), weight_offset,
                          m=m, pdl=use_pdl, out_vec=out_vec, **settings)

    def _spec_plan(self, spec, m: int | None, device=None) -> FusedPlan:
        """The plan of a problem with contiguous, 16-byte aligned tensors (the harness's), for M
        rows on ``device`` (None: no PDL)."""
        strides = (spec.row_stride, spec.n) if spec.rows > 1 else ()
        return self.plan_for(spec.dtype, spec.n, spec.has_weight, spec.has_bias,
                             choose_vec(spec.dtype, spec.n, strides), getattr(spec, "residual_dtype", None),
                             getattr(spec, "out_dtype", None), getattr(spec, "weight_offset", 0.0), m, device,
                             choose_out_vec(spec.n, strides[1:]))

    def prepare(self, spec) -> None:
        """Compile (or load from TileLang's disk cache) ahead of a timed region."""
        _compile(self.compile_key(spec))

    def compile_key(self, spec):
        return self._spec_plan(spec, spec.rows, spec.device)

    def m_thresholds(self, spec) -> tuple[int, ...]:
        """Few rows read once take the decode rule (fused_plan): another launch, the same bits."""
        return (DECODE_MAX_ROWS,) if self._spec_plan(spec, 1) != self._spec_plan(spec, None) else ()

    def offline_builds(self) -> tuple:
        """(dtype, N, residual, out dtype, weight offset, write) built for sm_90 on any machine:
        a power of two in every dtype, an odd N (scalar accesses), the one-read capacity edge, long
        rows (two reads, an odd N among them), and the op's own: a float32 residual, fp8 output,
        offset 1, in place (the same program as "new": the build checks that it reads before it
        writes); and the decode rule's PDL form ("decode_pdl" after the write: what a Hopper GPU
        runs for few rows), with an fp8 y for the ops without a residual (their call besides the
        offset)."""
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
        fp8 = "float8_e4m3fn" if not add and torch.float8_e4m3fn in self.out_dtypes else None
        b += [("bfloat16", 4096, r, fp8, 0.0, "new", "decode_pdl")]
        return tuple(b)

    def build_plan(self, build) -> FusedPlan:
        """The plan of one of ``offline_builds`` ("decode_pdl": one row's plan, in its PDL form)."""
        dtype, n, residual, out, offset, _write = build[:6]
        dt = getattr(torch, dtype)
        rdt = None if residual is None else (dtype if residual == "same" else residual)
        decode = "decode_pdl" in build[6:]
        plan = self.plan_for(dt, n, True, BASE_OP[self.op] == "layer_norm", choose_vec(dt, n), rdt, out, offset,
                             m=1 if decode else None)
        return dataclasses.replace(plan, pdl=True) if decode else plan

    def build_offline(self, build) -> dict:
        self.offline_tools()
        plan = self.build_plan(build)
        t0 = time.perf_counter()
        compiled = _compile(plan, compiler.SM90)
        seconds = time.perf_counter() - t0
        dtype, n, residual, out, offset, write = build[:6]
        if write == "in_place":
            bad = stores_before_loads(compiled.source())
            if bad:
                raise AssertionError(f"{plan.describe()} in place: a store before the loads of its row: {bad}")
        return {"dtype": dtype, "n": n, "residual": residual, "out_dtype": out, "weight_offset": offset,
                "write": write, "vec": plan.vec, "threads": plan.threads, "segments": plan.segments,
                "out_vec": plan.out_vec, "pdl": plan.pdl, "seconds": round(seconds, 2),
                "executed": cuda_present() and compiler.default_target() == compiler.SM90,
                **compiler.ptxas_report(compiled).to_dict()}

    # -- the call ------------------------------------------------------------------------
    def _forward(self, x, residual, weight, bias, eps: float, params: FusedParams, out: FusedOutputs) -> None:
        m, n = x.shape
        rows = [x, out.y] + ([residual, out.residual_out] if residual is not None else [])
        strides = tuple(t.stride(0) for t in rows) if m > 1 else ()
        vec = choose_vec(x.dtype, n, strides, tuple(_align_offset(t) for t in (*rows, weight, bias)))
        out_vec = None
        if params.out_dtype is not None:  # y's own vector: its stride and offset in bytes
            out_vec = choose_out_vec(n, (out.y.stride(0),) if m > 1 else (), (_align_offset(out.y),))
        plan = self.plan_for(x.dtype, n, weight is not None, bias is not None, vec,
                             None if residual is None else residual.dtype, params.out_dtype, params.weight_offset,
                             m, x.device, out_vec)
        self._launch(plan, x, residual, weight, bias, eps, params, out)

    def _launch(self, plan: FusedPlan, x, residual, weight, bias, eps: float, params: FusedParams,
                out: FusedOutputs) -> None:
        """Launch ``plan``'s kernel on 2-D rows (``_forward``'s, or a probe's plan for the same
        tensors: its vectors must divide their strides and offsets)."""
        compiled = _compile(plan)
        m = x.shape[0]
        vec = plan.vec
        step = lambda t, v=vec: t.stride(0) // v if m > 1 else 0  # noqa: E731  (row strides in vectors)
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
        args += [step(x)] + ([step(residual)] if residual is not None else []) + [step(out.y, plan.out_vec or vec)]
        args += [step(out.residual_out)] if residual is not None else []
        args += [float(eps), fp8_scale_argument(plan, params.scale)]
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
