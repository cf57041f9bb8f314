"""The project's Triton kernels of the fused family (impls.fused), as ``triton.fused``:
add_rms_norm and add_layer_norm (the residual add, residual_out written), rms_norm with Gemma's
(1 + w) or an fp8 output, layer_norm with an fp8 output. Kernels: _fused_kernels.

Forward: one tile per row where the row padded to a power of two fits ONE_TILE_MAX columns
(fused_norm_rowwise), else chunks of at most that many (fused_norm_looped, two passes: the
statistics, then residual_out and y). The launch setting is the plain kernels' for the base op,
N and dtype (settings.launch_config, without the decode rule), so it never depends on M and a
row's bits never depend on the rest of the batch.

Backward: the plain Triton backward's kernels (_bwd_kernels) with the effective weight w + offset
(the offset does not change dw = sum dy * x^), dx in float32; then fused_bwd_add adds
residual_out's gradient and stores dx and dresidual in their dtypes, each rounded once. Where
residual_out is 16-bit, the statistics of what it holds are taken first (a stats-only launch of
the forward kernel): the saved ones are the float32 sum's.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

import torch

from impls.base import DEFAULT_EPS
from impls.fused import (ADD_OPS, BASE_OP, FP8_DTYPES, FusedGrads, FusedNormKernel, FusedOutputs, FusedParams,
                         float32_reciprocal, fp8_max)
from impls.gpu_limits import cdiv, next_pow2
from impls.registry import register
from impls.repro_calls import through_normdiff
from impls.triton import _launch
from impls.triton.settings import (DECODE_MAX_ROWS, DECODE_MIN_BLOCK, REDUCE_WARPS, LaunchConfig, backward_config,
                                   launch_config)

# Rows whose padded width is at most this run in one tile; longer ones in chunks of at most this.
ONE_TILE_MAX = 8192
# fp8 formats: (mantissa bits, smallest normal exponent), for the interpreter's hand rounding.
FP8_FORMAT = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}
# fused_bwd_add's tile.
ADD_ROWS, ADD_BLOCK_N, ADD_WARPS = 4, 1024, 4


@lru_cache(maxsize=1)
def _kernels():
    return importlib.import_module("impls.triton._fused_kernels")


@lru_cache(maxsize=1)
def _bwd_kernels():
    return importlib.import_module("impls.triton._bwd_kernels")


class _TritonFused(FusedNormKernel):
    backend = "triton"
    variant = "fused"
    project = True
    repro_call = through_normdiff  # a repro calls normdiff's own kernel through normdiff (impls.repro_calls)
    packages = ("triton",)
    devices = _launch.DEVICES
    residual_dtypes = ("same", "float32")
    stats_on = "float32_sum"
    scale_convention = "divide"
    fp8_nan = "nan"
    source = "impls/triton/_fused_kernels.py"
    # Few rows take the decode setting (one row a program, other warps: another reduction order),
    # so a row's bits may change where M crosses DECODE_MAX_ROWS (m_thresholds).
    batch_invariant = False
    # Few rows launch with programmatic dependent launch where it runs (impls.pdl).
    pdl = True
    pdl_max_rows = DECODE_MAX_ROWS
    # fp8 output: y times the reciprocal of the scale, taken once on the host (_store_out).
    fp8_recip = True
    backward_batch_invariant = True  # dx per row (dw and db: the plain backward's fixed grouping)

    def availability(self) -> str | None:
        return _launch.state().reason

    def note(self) -> str:
        return _launch.note()

    def bench_unavailable(self) -> str | None:
        if _launch.state().interpreted:
            return "triton runs under its interpreter on this machine: not a timing"
        return None

    def config(self, n: int, dtype: torch.dtype, m: int | None = None) -> LaunchConfig:
        """One tile (block_n = N padded) up to ONE_TILE_MAX, else chunks of at most ONE_TILE_MAX;
        the plain kernels' setting for the base op, N, dtype and M: for at most DECODE_MAX_ROWS
        rows of one tile their decode rule (one row a program, the weight loaded with x)."""
        looped = next_pow2(n) > ONE_TILE_MAX
        cfg = launch_config(n, dtype, looped, BASE_OP[self.op], m)
        return LaunchConfig(block_n=min(cfg.block_n, ONE_TILE_MAX), rows=cfg.rows, num_warps=cfg.num_warps,
                            w_first=cfg.w_first and not looped)

    def m_thresholds(self, spec) -> tuple[int, ...]:
        one_tile = next_pow2(spec.n) <= ONE_TILE_MAX
        return (DECODE_MAX_ROWS,) if one_tile and next_pow2(spec.n) >= DECODE_MIN_BLOCK else ()

    def compile_key(self, spec, cfg: LaunchConfig | None = None):
        if _launch.state().interpreted or spec.device != "cuda":
            return None  # the interpreter compiles nothing
        # The JIT specialises on every pointer's dtype, the constexprs (N too, for chunked rows)
        # and integers equal to one or divisible by 16 (the row count, the strides).
        cfg = cfg or self.config(spec.n, spec.dtype, spec.rows)
        return (self.variant, self.op, spec.dtype, getattr(spec, "residual_dtype", None),
                getattr(spec, "out_dtype", None), getattr(spec, "write", "new"), spec.n, cfg, spec.has_weight,
                spec.has_bias, spec.rows == 1, spec.row_stride % 16 == 0, self.launches_pdl(spec.device, spec.rows))

    # -- forward ------------------------------------------------------------------------------
    def _forward(self, x, residual, weight, bias, eps: float, params: FusedParams, out: FusedOutputs,
                 cfg: LaunchConfig | None = None) -> None:
        self._launch(x, residual, weight, bias, out.y, out.residual_out, out.mean, out.rstd, eps, params, cfg)

    def _launch(self, x, residual, weight, bias, y, residual_out, mean, rstd, eps: float, params: FusedParams,
                cfg: LaunchConfig | None = None, stats_only: bool = False) -> None:
        """One launch over x's rows; stats_only: mean and rstd alone (y and residual_out unused)."""
        m, n = x.shape
        cfg = cfg or self.config(n, x.dtype, None if stats_only else m)
        interp = _launch.state().interpreted
        fp8 = params.out_dtype in FP8_DTYPES
        mbits, emin = FP8_FORMAT.get(params.out_dtype, (0, 0))
        has_res = residual is not None
        # Absent tensors: x stands in as a pointer the kernel never reads or writes.
        r = residual if has_res else x
        ro = residual_out if has_res else x
        y = x if stats_only else y
        mean = mean if mean is not None else rstd  # written for LayerNorm only
        kwargs = dict(IS_LN=BASE_OP[self.op] == "layer_norm", HAS_RES=has_res, HAS_WEIGHT=weight is not None,
                      HAS_BIAS=bias is not None, FP8=fp8, ROWS=cfg.rows, BLOCK_N=cfg.block_n,
                      ROUND_Y=interp and y.dtype == torch.bfloat16,
                      ROUND_R=interp and has_res and ro.dtype == torch.bfloat16,
                      FP8_FIX=interp and fp8, MBITS=mbits, EMIN=emin, STATS_ONLY=stats_only,
                      FP8_RECIP=self.fp8_recip, W_FIRST=cfg.w_first)
        if not interp:
            kwargs["num_warps"] = cfg.num_warps
        if not stats_only and self.launches_pdl(x.device, m):
            kwargs.update(PDL=True, launch_pdl=True)
        scale = float(params.scale or 1.0)
        if fp8 and self.fp8_recip:
            scale = float32_reciprocal(scale)  # the kernel multiplies by it
        fn = _kernels().fused_norm_looped if cfg.block_n < n else _kernels().fused_norm_rowwise
        args = (x, r, weight if weight is not None else x, bias if bias is not None else x, y, ro, mean, rstd,
                m, n, x.stride(0), r.stride(0), y.stride(0), ro.stride(0), eps, float(params.weight_offset),
                scale, fp8_max(params.out_dtype) if fp8 else 1.0)
        if self._recorded is not None:
            self._recorded.append((fn, (cdiv(m, cfg.rows),), args, kwargs))
            return
        _run(fn, x, (cdiv(m, cfg.rows),), args, kwargs)

    _recorded: list | None = None

    def launches(self, x: torch.Tensor, residual, weight, bias, params: FusedParams = FusedParams(),
                 eps: float | None = None) -> list[tuple]:
        """What a forward on these 2-D rows launches, as (kernel, grid, args, kwargs), without
        running anything: for the tools that compile the kernels offline (tools.pdl_wait_check,
        tools.decode_fp8_candidates) and tests. The tensors are never read."""
        m, n = x.shape
        out = FusedOutputs(y=torch.empty(m, n, dtype=params.out_dtype or x.dtype, device=x.device),
                           residual_out=None if residual is None else torch.empty_like(residual),
                           mean=torch.empty(m, device=x.device), rstd=torch.empty(m, device=x.device))
        self._recorded = []
        try:
            self._forward(x, residual, weight, bias, DEFAULT_EPS[self.op] if eps is None else eps, params, out)
            return self._recorded
        finally:
            del self._recorded

    # -- backward -----------------------------------------------------------------------------
    def _backward(self, src, weight, bias, dy, d_residual_out, saved: FusedOutputs, eps: float,
                  weight_offset: float, out: FusedGrads) -> None:
        m, n = src.shape
        interp = _launch.state().interpreted
        base = BASE_OP[self.op]
        cfg = backward_config(n, src.dtype, base)
        bwd = _bwd_kernels()
        f32 = dict(dtype=torch.float32, device=src.device)
        if self.op in ADD_OPS and src.dtype != torch.float32:
            # The forward's statistics are the float32 sum's; src is that sum rounded to
            # residual_out's dtype. The gradient is of the norm at src, so with src's own mean and
            # rstd (x^ of unit mean square): the saved ones would leave an error of their
            # difference (about 2**-9 / sqrt(N) relative) in dx.
            saved = FusedOutputs(y=src, mean=torch.empty(m, **f32) if base == "layer_norm" else None,
                                 rstd=torch.empty(m, **f32))
            self._launch(src, None, None, None, None, None, saved.mean, saved.rstd, eps, FusedParams(),
                         stats_only=True)
        # The effective weight in float32 (w + 1 rounded to a 16-bit dtype would lose w).
        w = src if weight is None else (weight.float() + weight_offset if weight_offset else weight)
        # dx straight into out.dx where nothing is added; else float32 first, rounded once at the end.
        direct = d_residual_out is None and out.dresidual is None
        ds = out.dx if direct else torch.empty(m, n, **f32)
        # dw and db: float32 partials per program of block_m rows, then a fixed-order reduction,
        # into contiguous buffers (the kernel writes stride 1).
        dw = out.dw if out.dw is None or out.dw.is_contiguous() else torch.empty(n, dtype=out.dw.dtype, device=src.device)
        db = out.db if out.db is None or out.db.is_contiguous() else torch.empty(n, dtype=out.db.dtype, device=src.device)
        is_ln = base == "layer_norm"
        mean = saved.mean if is_ln else saved.rstd  # never read for RMSNorm
        groups = cdiv(m, cfg.block_m)
        dwp = torch.empty(groups, n, **f32) if dw is not None else saved.rstd
        dbp = torch.empty(groups, n, **f32) if db is not None else saved.rstd
        c1 = c2 = saved.rstd  # never read in the one-tile form
        opts = {} if interp else {"num_warps": cfg.num_warps}
        flags = dict(HAS_WEIGHT=weight is not None, IS_LN=is_ln)
        if not cfg.one_tile:
            c1, c2 = torch.empty(m, **f32), torch.empty(m, **f32)
            _run(bwd.bwd_row_stats, src, (cdiv(m, cfg.rows),),
                 (src, dy, w, mean, saved.rstd, c1, c2, m, n, src.stride(0), dy.stride(0)),
                 dict(**flags, ROWS=cfg.rows, BLOCK_N=cfg.block_n, **opts))
        row_opts = opts if interp or not cfg.maxnreg else {**opts, "maxnreg": cfg.maxnreg}
        _run(bwd.bwd_rows, src, (groups, cdiv(n, cfg.block_n)),
             (src, dy, w, mean, saved.rstd, c1, c2, ds, dwp, dbp, m, n, src.stride(0), dy.stride(0), ds.stride(0)),
             dict(**flags, HAS_DW=dw is not None, HAS_DB=db is not None, ONE_TILE=cfg.one_tile,
                  BLOCK_M=cfg.block_m, SPAN=cfg.block_m if m >= cfg.block_m else max(cfg.rows, next_pow2(m)),
                  ROWS=cfg.rows, BLOCK_N=cfg.block_n, ROUND_BF16=interp and ds.dtype == torch.bfloat16,
                  STAGES=cfg.stages, **row_opts))
        if dw is not None or db is not None:
            grad_dtype = (dw if dw is not None else db).dtype  # the parameters' dtype (x's)
            _run(bwd.bwd_reduce, src, (cdiv(n, cfg.reduce_n),),
                 (dwp, dbp, dw if dw is not None else dwp, db if db is not None else dbp, groups, n),
                 dict(HAS_DW=dw is not None, HAS_DB=db is not None, PARTS=cfg.reduce_parts,
                      ITERS=next_pow2(cdiv(groups, cfg.reduce_parts)), BLOCK_N=cfg.reduce_n,
                      ROUND_BF16=interp and grad_dtype == torch.bfloat16,
                      **({} if interp else {"num_warps": REDUCE_WARPS})))
        for mine, theirs in ((dw, out.dw), (db, out.db)):
            if mine is not theirs:
                theirs.copy_(mine)
        if not direct:
            dro = d_residual_out if d_residual_out is not None else ds
            dres = out.dresidual if out.dresidual is not None else out.dx
            _run(_kernels().fused_bwd_add, src, (cdiv(m, ADD_ROWS), cdiv(n, ADD_BLOCK_N)),
                 (ds, dro, out.dx, dres, m, n, ds.stride(0), dro.stride(0), out.dx.stride(0), dres.stride(0)),
                 dict(HAS_DRO=d_residual_out is not None, HAS_DRES=out.dresidual is not None, ROWS=ADD_ROWS,
                      BLOCK_N=ADD_BLOCK_N, ROUND_DX=interp and out.dx.dtype == torch.bfloat16,
                      ROUND_DRES=interp and dres.dtype == torch.bfloat16,
                      **({} if interp else {"num_warps": ADD_WARPS})))


def _run(fn, x: torch.Tensor, grid: tuple, args: tuple, kwargs: dict) -> None:
    if x.device.type == "cuda":
        with torch.cuda.device(x.device):
            fn[grid](*args, **kwargs)
    else:
        fn[grid](*args, **kwargs)


@register
class TritonAddRMSNorm(_TritonFused):
    op = "add_rms_norm"
    outputs = ("y", "residual_out", "rstd")
    writes = ("new", "in_place", "out_y")
    weight_offsets = (0.0, 1.0)
    out_dtypes = (None, *FP8_DTYPES)


@register
class TritonAddLayerNorm(_TritonFused):
    op = "add_layer_norm"
    outputs = ("y", "residual_out", "mean", "rstd")
    writes = ("new", "in_place", "out_y")


@register
class TritonRMSNormFused(_TritonFused):
    """rms_norm with Gemma's offset or an fp8 output."""
    op = "rms_norm"
    outputs = ("y", "rstd")
    weight_offsets = (0.0, 1.0)
    out_dtypes = (None, *FP8_DTYPES)


@register
class TritonLayerNormFused(_TritonFused):
    """layer_norm with an fp8 output."""
    op = "layer_norm"
    outputs = ("y", "mean", "rstd")
    out_dtypes = (None, *FP8_DTYPES)
