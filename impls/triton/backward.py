"""The Triton backward pass, shared by every Triton variant (rowwise, looped, split and the
dispatch kernels auto and invariant): it needs only the forward's saved mean and rstd, which all
variants write in the same layout, so one backward serves them all. Kernels: _bwd_kernels.

Launch settings depend on op, N and dtype only, never on M:

- dx is computed per row with the same tile and reduction order at every M: a row's dx bits do
  not depend on the rest of the batch (batch invariant).
- dw and db: accumulated in float32 in the same pass as dx (x and dy read once), one partial per
  program of block_m rows, then a fixed-order reduction of the partials over narrow column
  blocks. Deterministic (no atomics). dw over M rows
  depends on M, as a sum does; the grouping of rows into partials is fixed, so the bits of dw for
  a given set of rows never move with the launch. The price: at small M there are few programs
  (M / block_m), too few to fill the GPU; a grid sized to the SMs would fill it but move dw's
  bits with M, so it is not used.

The launch settings (settings.backward_config): tuned_h200.toml's backward rows where a probe
measured the shape, else the rule in settings.py.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

import torch

from impls.base import NormGrads, NormOutputs
from impls.gpu_limits import cdiv, next_pow2
from impls.triton._runtime import state
from impls.triton.settings import REDUCE_WARPS, BackwardConfig, backward_config


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
