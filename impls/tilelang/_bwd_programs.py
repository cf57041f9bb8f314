"""The TileLang backward program, one builder for both ops (plan.variant "rms_norm_bwd" or
"layer_norm_bwd"); the conventions of _programs (flat x, dy and dx with row strides in units of
``vec``, symbolic M, rows padded inside the kernel to ``plan.padded`` columns, every global
access guarded, raw rows loaded in the input dtype).

One block per ``plan.block_m`` rows, one row at a time with the whole padded row in register
fragments. Per row: c1 = sum(g x^) (and for LayerNorm c2 = sum(g)) with g = dy w and x^ from the
forward's saved mean and rstd, then dx; dy x^ (and dy) accumulated over the block's rows in
float32 fragments, written once as row ``bx`` of the partials (dw's N columns, then db's). The
partials' sum over blocks is the caller's (impls/tilelang/backward.py). ``BM`` (rows per block)
is a run-time value: the grid is the partials' row count.

Registers decide the speed (occupancy is what keeps loads in flight): only the raw rows (in the
input dtype) and the accumulators live across the row's reductions; x^ and g are recomputed from
the raw rows where they are used. Padded lanes and rows past M load as zero, so g, and with it
every term they add to c1, c2, dw and db, is zero there. With ``plan.prefetch`` the next row's x,
dy, mean and rstd are loaded before this row's reductions, so their latency overlaps this row's
work.
"""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang._program_parts import F32, _row_layout, _signature_sizes


def norm_bwd(plan):
    N, P, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype
    NW, _ = _signature_sizes(plan)
    M, G = T.dynamic("M"), T.dynamic("G")
    LX, LD, LDX = (T.dynamic(n, "int64") for n in ("LX", "LD", "LDX"))  # flat lengths may pass 2**31
    is_ln, has_w, has_b, pre = plan.variant == "layer_norm_bwd", plan.has_weight, plan.has_bias, plan.prefetch

    def w_of(W, j):
        return T.cast(T.if_then_else(j < N, W[j], T.cast(0, dt)), F32) if has_w else 1.0

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), DY: T.Tensor((LD,), dt), W: T.Tensor((NW,), dt), MEAN: T.Tensor((M,), F32),
        RSTD: T.Tensor((M,), F32), DX: T.Tensor((LDX,), dt), DP: T.Tensor((G, N * (2 if has_b else 1)), F32),
        sxv: T.int64, sdyv: T.int64, sdxv: T.int64, BM: T.int32,
    ):
        with T.Kernel(G, threads=plan.threads) as bx:
            if plan.min_blocks:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            xr = T.alloc_fragment((1, P), dt)
            dyr = T.alloc_fragment((1, P), dt)
            xn = T.alloc_fragment((1, P), dt)  # the next row (prefetch only)
            dyn = T.alloc_fragment((1, P), dt)
            t = T.alloc_fragment((1, P), F32)  # a reduction's input
            adw = T.alloc_fragment((1, P), F32)
            adb = T.alloc_fragment((1, P), F32)
            c1 = T.alloc_fragment((1,), F32)
            c2 = T.alloc_fragment((1,), F32)
            mean = T.alloc_fragment((1,), F32)
            rstd = T.alloc_fragment((1,), F32)
            meann = T.alloc_fragment((1,), F32)  # the next row's (prefetch only)
            rstdn = T.alloc_fragment((1,), F32)
            T.annotate_layout({b: _row_layout(plan, 1, P) for b in (xr, dyr, xn, dyn, t, adw, adb)})
            for r, j in T.Parallel(1, P):
                adw[r, j] = 0.0
            if has_b:
                for r, j in T.Parallel(1, P):
                    adb[r, j] = 0.0
            if pre:  # the block's first row
                for r, j in T.Parallel(1, P):
                    xr[r, j] = T.if_then_else(
                        (j < N) & (bx * BM < M), X[T.cast(bx, "int64") * BM * sxv * vec + j], T.cast(0, dt))
                for r, j in T.Parallel(1, P):
                    dyr[r, j] = T.if_then_else(
                        (j < N) & (bx * BM < M), DY[T.cast(bx, "int64") * BM * sdyv * vec + j], T.cast(0, dt))
                rstd[0] = T.if_then_else(bx * BM < M, RSTD[bx * BM], 0.0)
                mean[0] = T.if_then_else(bx * BM < M, MEAN[bx * BM], 0.0) if is_ln else 0.0
            for i in T.serial(BM):
                row = bx * BM + i
                # x and dy in separate loops: one store per loop keeps TileLang's 16-byte vectors.
                if pre:
                    for r, j in T.Parallel(1, P):
                        xn[r, j] = T.if_then_else(
                            (j < N) & (row + 1 < M) & (i + 1 < BM),
                            X[T.cast(row + 1, "int64") * sxv * vec + j], T.cast(0, dt))
                    for r, j in T.Parallel(1, P):
                        dyn[r, j] = T.if_then_else(
                            (j < N) & (row + 1 < M) & (i + 1 < BM),
                            DY[T.cast(row + 1, "int64") * sdyv * vec + j], T.cast(0, dt))
                    # The statistics too: a load waited on at every row otherwise.
                    rstdn[0] = T.if_then_else((row + 1 < M) & (i + 1 < BM), RSTD[row + 1], 0.0)
                    meann[0] = T.if_then_else((row + 1 < M) & (i + 1 < BM), MEAN[row + 1], 0.0) if is_ln else 0.0
                else:
                    for r, j in T.Parallel(1, P):
                        xr[r, j] = T.if_then_else(
                            (j < N) & (row < M), X[T.cast(row, "int64") * sxv * vec + j], T.cast(0, dt))
                    for r, j in T.Parallel(1, P):
                        dyr[r, j] = T.if_then_else(
                            (j < N) & (row < M), DY[T.cast(row, "int64") * sdyv * vec + j], T.cast(0, dt))
                    rstd[0] = T.if_then_else(row < M, RSTD[row], 0.0)
                    mean[0] = T.if_then_else(row < M, MEAN[row], 0.0) if is_ln else 0.0
                for r, j in T.Parallel(1, P):
                    t[r, j] = T.cast(dyr[r, j], F32) * w_of(W, j) * ((T.cast(xr[r, j], F32) - mean[0]) * rstd[0])
                T.reduce_sum(t, c1, dim=1)
                if is_ln:
                    for r, j in T.Parallel(1, P):
                        t[r, j] = T.cast(dyr[r, j], F32) * w_of(W, j)
                    T.reduce_sum(t, c2, dim=1)
                for r, j in T.Parallel(1, P):
                    if (j < N) & (row < M):
                        DX[T.cast(row, "int64") * sdxv * vec + j] = T.cast(
                            (T.cast(dyr[r, j], F32) * w_of(W, j) - (c2[0] / N if is_ln else 0.0)
                             - (T.cast(xr[r, j], F32) - mean[0]) * rstd[0] * (c1[0] / N)) * rstd[0], dt)
                for r, j in T.Parallel(1, P):
                    adw[r, j] += T.cast(dyr[r, j], F32) * ((T.cast(xr[r, j], F32) - mean[0]) * rstd[0])
                if has_b:
                    for r, j in T.Parallel(1, P):
                        adb[r, j] += T.cast(dyr[r, j], F32)
                if pre:
                    for r, j in T.Parallel(1, P):
                        xr[r, j] = xn[r, j]
                    for r, j in T.Parallel(1, P):
                        dyr[r, j] = dyn[r, j]
                    rstd[0] = rstdn[0]
                    mean[0] = meann[0]
            for r, j in T.Parallel(1, P):
                if j < N:
                    DP[bx, j] = adw[r, j]
            if has_b:
                for r, j in T.Parallel(1, P):
                    if j < N:
                        DP[bx, N + j] = adb[r, j]

    return main
