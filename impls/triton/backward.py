"""The Triton backward pass, shared by every Triton variant (rowwise, looped, split and the
dispatch kernels auto and invariant): it needs only the forward's saved mean and rstd, which all
variants write in the same layout, so one backward serves them all. Kernels: _bwd_kernels.

Launch settings depend on op, N and dtype only, never on M:

- dx is computed per row with the same tile and reduction order at every M: a row's dx bits do
  not depend on the rest of the batch (batch invariant).
- dw and db: accumulated in float32 in the same pass as dx (x and dy read once), one partial per
  program of block_m rows (from N and dtype: BWD_SETTINGS or the rule), then a fixed-order
  reduction of the partials over narrow column blocks. Deterministic (no atomics). dw over M rows
  depends on M, as a sum does; the grouping of rows into partials is fixed, so the bits of dw for
  a given set of rows never move with the launch. The price: at small M there are few programs
  (M / block_m), too few to fill the GPU; a grid sized to the SMs would fill it but move dw's
  bits with M, so it is not used.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache

import torch

from impls.base import NormGrads, NormOutputs
from impls.gpu_limits import cdiv, next_pow2

# Launch settings: (op, bytes per element, tile width) -> (rows per program, rows per tile, warps[,
# a cap on registers per thread for ptxas (0: none)[, stages: 0 the next tile loaded into registers,
# >= 2 Triton's software pipeline of that many stages, tiles ahead copied into shared memory]]).
# Rows per program is the rows of one dw/db partial:
# from op, N and dtype only, so the grouping of rows into partials (and the reduction tree) never
# moves with M. The 16-bit entries are the fastest of tools/bwd_probe.py's candidates on the H200
# (bf16, 2026-12-02, docs/perf-notes.md item 35); absent shapes take the rule in backward_config.
BWD_SETTINGS = {  # tools/bwd_probe.py on the H200 (reports/h200/README.md)
    # 2026-12-03 (docs/perf-notes.md item 50): 3 stages (two tiles ahead in shared memory) led the
    # register form at every N of LayerNorm and at RMSNorm 1024 and 8192; at RMSNorm 2048 and 4096
    # the register form with a cap stayed ahead (92.2 / 90.7% against 90.9 / 90.5%).
    ("rms_norm", 2, 1024): (64, 2, 4, 0, 3),  # 89.5% against (32, 1, 2)'s 85.7%
    ("rms_norm", 2, 2048): (64, 1, 8, 64),
    ("rms_norm", 2, 4096): (64, 1, 16, 64),
    ("rms_norm", 2, 8192): (128, 1, 16, 0, 3),  # 93.7% against 91.7%
    # two probes at 1465701: 87.1 / 87.3% against (64, 1, 4, 0, 3)'s 85.9 / 86.7% (that one: 83.6 and
    # 85.6% in two benchmark runs); 512 programs of 2-row tiles, one wave at 5 blocks an SM. The
    # benchmark at 10dcbf0: 88.0 and 87.4%
    ("layer_norm", 2, 1024): (128, 2, 4, 0, 3),
    ("layer_norm", 2, 2048): (64, 1, 4, 0, 3),  # 89.4% against 84.7%
    ("layer_norm", 2, 4096): (64, 1, 8, 0, 3),  # 88.3% against 86.7%
    ("layer_norm", 2, 8192): (128, 1, 16, 0, 3),  # 90.3% against 89.2%
}
# The rule: at least BWD_BLOCK_M rows per program; tiles of about BWD_TILE_ELEMS values, at most
# PER_THREAD float32 values per thread and at most MAX_WARPS warps.
BWD_BLOCK_M = 64
BWD_TILE_ELEMS = 4096
PER_THREAD = 8
MAX_WARPS = 16
# Rows of up to this many columns (padded to a power of two) are one tile: c1, c2 in the row kernel.
BWD_ONE_TILE_MAX = 8192
# Longer rows: column blocks of this width, after a pass that writes c1, c2 per row; rows per
# program for them.
BWD_COL_BLOCK = 1024
BWD_LONG_BLOCK_M = 32
# The final reduction: narrow column blocks (REDUCE_PROGRAMS of them where N allows, between
# REDUCE_MIN_N and REDUCE_MAX_N columns), REDUCE_TILE partial values per step.
REDUCE_PROGRAMS, REDUCE_MIN_N, REDUCE_MAX_N, REDUCE_TILE, REDUCE_WARPS = 128, 16, 256, 8192, 8


@dataclass(frozen=True)
class BackwardConfig:
    block_n: int  # columns per tile
    rows: int  # rows per tile (a divisor of block_m)
    num_warps: int
    one_tile: bool  # block_n covers N
    block_m: int = BWD_BLOCK_M  # rows per program: one dw/db partial
    reduce_n: int = 64  # the reduction's columns per program
    reduce_parts: int = 64  # the reduction's partial rows per step
    maxnreg: int | None = None  # a cap on the row kernel's registers per thread (compiled only)
    stages: int = 0  # tiles ahead: 0 one, in registers; >= 2 stages - 1, by Triton's pipeliner (bwd_rows)


def _warps(elems: int) -> int:
    return min(MAX_WARPS, max(1, next_pow2(max(1, elems // (32 * PER_THREAD)))))


def backward_config(n: int, dtype: torch.dtype, op: str = "rms_norm", one_tile_max: int = BWD_ONE_TILE_MAX,
                    col_block: int = BWD_COL_BLOCK, setting: tuple | None = None) -> BackwardConfig:
    """The backward's launch setting for rows of N in dtype: ``setting`` (rows per program, rows
    per tile, warps[, maxnreg]) if given, else BWD_SETTINGS, else the rule."""
    block_n = next_pow2(n)
    one_tile = block_n <= one_tile_max
    if not one_tile:
        block_n = col_block
    reduce_n = min(REDUCE_MAX_N, max(REDUCE_MIN_N, next_pow2(n) // REDUCE_PROGRAMS))
    reduce = dict(reduce_n=reduce_n, reduce_parts=max(1, REDUCE_TILE // reduce_n))
    setting = setting or (BWD_SETTINGS.get((op, dtype.itemsize, block_n)) if one_tile else None)
    if setting:
        block_m, rows, warps, *rest = setting
        if len(rest) > 2:
            raise ValueError(f"a backward setting has 3 to 5 fields, not {len(setting)}: {setting}")
        cap, stages = (list(rest) + [0, 0])[:2]
        if block_m % rows:
            raise ValueError(f"rows per tile ({rows}) must divide rows per program ({block_m})")
        if stages == 1 or stages < 0:
            raise ValueError(f"stages must be 0 (the next tile in registers) or at least 2, not {stages}")
        return BackwardConfig(block_n, rows, warps, one_tile, block_m, **reduce, maxnreg=cap or None,
                              stages=stages)
    rows = max(1, BWD_TILE_ELEMS // block_n)
    block_m = max(BWD_BLOCK_M if one_tile else BWD_LONG_BLOCK_M, rows)
    return BackwardConfig(block_n, rows, _warps(rows * block_n), one_tile, block_m, **reduce)


@lru_cache(maxsize=1)
def _kernels():
    return importlib.import_module("impls.triton._bwd_kernels")


class TritonBackward:
    """Mixin of TritonKernel: ``_backward`` on 2-D rows into the caller's NormGrads."""

    # (why the backward is as it is: the module docstring)
    backward_nondeterministic: str | None = None
    backward_batch_invariant = True  # dx per row; dw/db are sums over the batch by definition

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads,
                  cfg: BackwardConfig | None = None) -> None:
        from impls.triton._launch import state

        m, n = x.shape
        cfg = cfg or backward_config(n, x.dtype, self.op)
        given = out
        if any(t is not None and not t.is_contiguous() for t in (out.dw, out.db)):  # the kernel writes stride 1
            out = NormGrads(out.dx, *(None if t is None else torch.empty(n, dtype=t.dtype, device=t.device)
                                      for t in (out.dw, out.db)))
        interp = state().interpreted
        round_bf16 = interp and x.dtype == torch.bfloat16
        is_ln = self.op == "layer_norm"
        has_dw, has_db = out.dw is not None, out.db is not None
        w = weight if weight is not None else x  # never read when HAS_WEIGHT is off
        mean = saved.mean if is_ln else saved.rstd  # never read for RMSNorm
        groups = cdiv(m, cfg.block_m)
        f32 = dict(dtype=torch.float32, device=x.device)
        dwp = torch.empty(groups, n, **f32) if has_dw else saved.rstd
        dbp = torch.empty(groups, n, **f32) if has_db else saved.rstd
        c1 = c2 = saved.rstd  # never read in the one-tile form
        opts = {} if interp else {"num_warps": cfg.num_warps}
        row_opts = opts if interp or not cfg.maxnreg else {**opts, "maxnreg": cfg.maxnreg}
        flags = dict(HAS_WEIGHT=weight is not None, IS_LN=is_ln)
        if not cfg.one_tile:
            c1, c2 = torch.empty(m, **f32), torch.empty(m, **f32)
            self._bwd_launch("bwd_row_stats", x, (cdiv(m, cfg.rows),),
                             (x, dy, w, mean, saved.rstd, c1, c2, m, n, x.stride(0), dy.stride(0)),
                             dict(**flags, ROWS=cfg.rows, BLOCK_N=cfg.block_n, **opts))
        self._bwd_launch("bwd_rows", x, (groups, cdiv(n, cfg.block_n)),
                         (x, dy, w, mean, saved.rstd, c1, c2, out.dx, dwp, dbp, m, n, x.stride(0), dy.stride(0),
                          out.dx.stride(0)),
                         dict(**flags, HAS_DW=has_dw, HAS_DB=has_db, ONE_TILE=cfg.one_tile, BLOCK_M=cfg.block_m,
                              SPAN=cfg.block_m if m >= cfg.block_m else max(cfg.rows, next_pow2(m)),
                              ROWS=cfg.rows, BLOCK_N=cfg.block_n, ROUND_BF16=round_bf16, STAGES=cfg.stages,
                              **row_opts))
        if has_dw or has_db:
            self._bwd_launch("bwd_reduce", x, (cdiv(n, cfg.reduce_n),),
                             (dwp, dbp, out.dw if has_dw else dwp, out.db if has_db else dbp, groups, n),
                             dict(HAS_DW=has_dw, HAS_DB=has_db, PARTS=cfg.reduce_parts,
                                  ITERS=next_pow2(cdiv(groups, cfg.reduce_parts)), BLOCK_N=cfg.reduce_n,
                                  ROUND_BF16=round_bf16, **({} if interp else {"num_warps": REDUCE_WARPS})))
        for mine, theirs in ((out.dw, given.dw), (out.db, given.db)):
            if mine is not theirs:
                theirs.copy_(mine)

    _bwd_recorded: list | None = None

    def _bwd_launch(self, name: str, x: torch.Tensor, grid: tuple, args: tuple, kwargs: dict) -> None:
        fn = getattr(_kernels(), name)
        if self._bwd_recorded is not None:
            self._bwd_recorded.append((name, fn, args, kwargs))
        elif x.device.type == "cuda":
            with torch.cuda.device(x.device):
                fn[grid](*args, **kwargs)
        else:
            fn[grid](*args, **kwargs)

    def backward_launches(self, x: torch.Tensor, weight=None, bias=None,
                          cfg: BackwardConfig | None = None) -> list[tuple]:
        """(kernel name, @triton.jit function, arguments, keyword arguments) of each launch a
        backward on these rows would make, without running anything (tools.triton_resources
        compiles them offline); the tensors are never read."""
        m = x.shape[0]
        stat = torch.empty(m, dtype=torch.float32, device=x.device)
        saved = NormOutputs(y=x, mean=stat if self.op == "layer_norm" else None, rstd=stat)
        out = NormGrads(torch.empty_like(x), None if weight is None else torch.empty_like(weight),
                        None if bias is None else torch.empty_like(bias))
        self._bwd_recorded = []
        try:
            self._backward(x, weight, bias, torch.empty_like(x), saved, 1e-5, out, cfg)
            return self._bwd_recorded
        finally:
            del self._bwd_recorded
