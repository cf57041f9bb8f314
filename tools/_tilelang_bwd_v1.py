"""The TileLang backward as it was at ad2ada3 (docs/perf-notes.md item 34), kept as the baseline
tools/tilelang_bwd_probe.py times the current plans against in the same process: one block per 32
rows, two vectors a thread, no launch bound, dw and db partials always written."""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import torch
import tilelang.language as T

from impls.gpu_limits import cdiv, next_pow2
from impls.tilelang import compiler
from impls.tilelang._programs import F32, _row_layout, _signature_sizes
from impls.tilelang.plan import Plan

BLOCK_M = 32
_KERNELS: dict = {}


def norm_bwd_v1(plan: Plan, block_m: int):
    N, P, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype
    NW, _ = _signature_sizes(plan)
    M, G, LX, LD, LDX = T.dynamic("M"), T.dynamic("G"), T.dynamic("LX"), T.dynamic("LD"), T.dynamic("LDX")
    is_ln, has_w = plan.variant == "layer_norm_bwd", plan.has_weight

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), DY: T.Tensor((LD,), dt), W: T.Tensor((NW,), dt), MEAN: T.Tensor((M,), F32),
        RSTD: T.Tensor((M,), F32), DX: T.Tensor((LDX,), dt), DWP: T.Tensor((G, N), F32), DBP: T.Tensor((G, N), F32),
        sxv: T.int64, sdyv: T.int64, sdxv: T.int64,
    ):
        with T.Kernel(T.ceildiv(M, block_m), threads=plan.threads) as bx:
            xr = T.alloc_fragment((1, P), dt)
            dyr = T.alloc_fragment((1, P), dt)
            xh = T.alloc_fragment((1, P), F32)
            g = T.alloc_fragment((1, P), F32)
            gx = T.alloc_fragment((1, P), F32)
            adw = T.alloc_fragment((1, P), F32)
            adb = T.alloc_fragment((1, P), F32)
            c1 = T.alloc_fragment((1,), F32)
            c2 = T.alloc_fragment((1,), F32)
            mean = T.alloc_fragment((1,), F32)
            rstd = T.alloc_fragment((1,), F32)
            T.annotate_layout({t: _row_layout(plan, 1, P) for t in (xr, dyr, xh, g, gx, adw, adb)})
            for r, j in T.Parallel(1, P):
                adw[r, j] = 0.0
                adb[r, j] = 0.0
            for i in T.serial(block_m):
                row = bx * block_m + i
                rstd[0] = T.if_then_else(row < M, RSTD[row], 0.0)
                mean[0] = T.if_then_else(row < M, MEAN[row], 0.0) if is_ln else 0.0
                for r, j in T.Parallel(1, P):
                    xr[r, j] = T.if_then_else(
                        (j < N) & (row < M), X[T.cast(row, "int64") * sxv * vec + j], T.cast(0, dt))
                    dyr[r, j] = T.if_then_else(
                        (j < N) & (row < M), DY[T.cast(row, "int64") * sdyv * vec + j], T.cast(0, dt))
                for r, j in T.Parallel(1, P):
                    xh[r, j] = T.if_then_else(j < N, (T.cast(xr[r, j], F32) - mean[0]) * rstd[0], 0.0)
                    g[r, j] = T.cast(dyr[r, j], F32) * T.cast(T.if_then_else(j < N, W[j], T.cast(0, dt)), F32) \
                        if has_w else T.cast(dyr[r, j], F32)
                for r, j in T.Parallel(1, P):
                    gx[r, j] = g[r, j] * xh[r, j]
                T.reduce_sum(gx, c1, dim=1)
                if is_ln:
                    T.reduce_sum(g, c2, dim=1)
                for r, j in T.Parallel(1, P):
                    if (j < N) & (row < M):
                        DX[T.cast(row, "int64") * sdxv * vec + j] = T.cast(
                            (g[r, j] - (c2[0] / N if is_ln else 0.0) - xh[r, j] * (c1[0] / N)) * rstd[0], dt)
                for r, j in T.Parallel(1, P):
                    adw[r, j] += T.cast(dyr[r, j], F32) * xh[r, j]
                    adb[r, j] += T.cast(dyr[r, j], F32)
            for r, j in T.Parallel(1, P):
                if j < N:
                    DWP[bx, j] = adw[r, j]
                    DBP[bx, j] = adb[r, j]

    return main


def v1_plan(op: str, n: int, vec: int) -> Plan:
    tpr = min(512, max(32, next_pow2(cdiv(cdiv(n, vec), 2))))
    return Plan(f"{op}_bwd", "bfloat16", n, True, op == "layer_norm", vec, tpr, 1, cdiv(n, tpr * vec) * tpr * vec)


def v1_kernel(plan: Plan):
    if plan not in _KERNELS:
        _KERNELS[plan] = compiler.compile_program(norm_bwd_v1(plan, BLOCK_M), plan, what=f"v1 {plan.describe()}")
    return _KERNELS[plan]


def run_v1(plan: Plan, x, w, dy, saved, out) -> None:
    """The old host side: partials per 32 rows, each summed by torch and copied."""
    m, n = x.shape
    kernel = v1_kernel(plan)
    groups = cdiv(m, BLOCK_M)
    dwp = torch.empty(groups, n, dtype=torch.float32, device=x.device)
    dbp = torch.empty(groups, n, dtype=torch.float32, device=x.device)
    mean = saved.mean if saved.mean is not None else saved.rstd
    v = plan.vec
    kernel(x.view(-1), dy.view(-1), w, mean, saved.rstd, out.dx.view(-1), dwp, dbp,
           x.stride(0) // v, dy.stride(0) // v, out.dx.stride(0) // v)
    out.dw.copy_(dwp.sum(0))
    if out.db is not None:
        out.db.copy_(dbp.sum(0))
