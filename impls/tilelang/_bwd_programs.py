"""The TileLang backward program, one builder for both ops (plan.variant "rms_norm_bwd" or
"layer_norm_bwd"); the conventions of _programs (flat x, dy and dx with row strides in units of
``vec``, symbolic M, rows padded inside the kernel to ``plan.padded`` columns, every global
access guarded, raw rows loaded in the input dtype).

One block per BWD_BLOCK_M rows, one row at a time with the whole padded row in register
fragments: x^ from the forward's saved mean and rstd (zero in padded lanes, so they never enter
c1 = sum(g x^) or c2 = sum(g)), dx stored, and dy x^ and dy accumulated over the block's rows in
float32 fragments, written as row ``bx`` of the dw/db partials. The partials' sum over blocks is
the caller's (impls/tilelang/backward.py)."""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang._programs import F32, _row_layout, _signature_sizes
from impls.tilelang.plan import Plan


def norm_bwd(plan: Plan, block_m: int):
    N, P, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype
    NW, _ = _signature_sizes(plan)
    M, G = T.dynamic("M"), T.dynamic("G")
    LX, LD, LDX = (T.dynamic(n, "int64") for n in ("LX", "LD", "LDX"))  # flat lengths may pass 2**31
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
