"""The TileLang program of the fused kernels (impls.tilelang.fused): the residual add, the norm
(RMSNorm or LayerNorm), Gemma's weight offset and the fp8 output, one row per thread group.

Imported only when a fused kernel is compiled (it imports tilelang). It follows _programs'
conventions: flat x, residual, y and residual_out with row strides in units of ``vec``; M from
rstd's shape; every global access guarded by its own condition; float32 compute.

- One read (``plan.segments == 1``): the padded row of x + residual lives in a float32 register
  fragment from the load to the stores, ``rows_per_block`` rows per block as the fragment kernel.
- Two reads (longer rows): segments of ``plan.padded`` columns, one row per block; the first pass
  only reduces, the second reads x and residual again (segments in reverse: the last read are
  still in L2) and writes residual_out and y.
- LayerNorm: the mean, then (one read) corrected by the mean of s - mean, then the variance of
  the centred values (no E[s^2] - E[s]^2 cancellation). The correction makes a row of one value's
  mean exact and its x^ zero (its sum rounds, and x^ would be that error times 1/sqrt(eps), which
  moved fp8 outputs past a rounding midpoint); a shift by the row's first value would do it with
  one reduction fewer, but lost accuracy on rows whose first value is far from the rest. The
  two-read program merges its segments' statistics (Chan) without the correction.
"""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang import _programs
from impls.tilelang._program_parts import F32, _load_params, _params_at, _row_layout

FUSED_VARIANT = "fused"


def _load(buf, dt, row, stride, vec, col, ok):
    """float32 of ``buf[row, col]`` where ``ok``, else 0 (the load itself inside the guard)."""
    return T.cast(T.if_then_else(ok, buf[T.cast(row, "int64") * stride * vec + col], T.cast(0, dt)), F32)


def _affine(plan, v, W, B, j):
    """float32 ``v * (W[j] + offset) + B[j]``, with the terms the plan has (``j`` an index, or
    (r, j) for the fragments a PDL program loaded them into)."""
    if plan.has_weight:
        w = T.cast(W[j], F32)
        if plan.weight_offset:
            w = w + T.float32(plan.weight_offset)
        v = v * w
    if plan.has_bias:
        v = v + T.cast(B[j], F32)
    return v


def _fp8(plan, v, scale):
    """The fp8 output's float32 value: scaled (divided by the scale, or multiplied by its
    reciprocal: FusedPlan.fp8_scale), clamped to the format's largest finite value. The clamp
    compares rather than taking min/max: fminf(NaN, 448) is 448, and a NaN must stay NaN (the
    cast keeps it: cvt.satfinite turns NaN into NaN)."""
    top = T.float32(plan.fp8_max)
    v = v / scale if plan.fp8_scale == "divide" else v * scale
    return T.if_then_else(v > top, top, T.if_then_else(v < -top, -top, v))


@T.macro
def _scale_once(plan, rs, scale):
    """The factor of the fp8 scaling in ``rs[0]``: 1/scale taken once for "reciprocal", else the
    argument itself (the scale to divide by, or the host's reciprocal)."""
    if plan.fp8_scale == "reciprocal":
        rs[0] = T.float32(1.0) / scale
    else:
        rs[0] = scale


def _one_read(plan):
    N, RB, P, vec, dt, rdt = plan.n, plan.rows_per_block, plan.padded, plan.vec, plan.dtype, plan.residual_dtype
    ydt, fp8 = plan.out_dtype or dt, plan.out_dtype is not None  # ("or" in the macro would be TIR's)
    yvec = plan.out_vec or vec  # y's row stride comes in these
    ln = plan.layer_norm
    M = T.dynamic("M")
    layout = _row_layout(plan, RB, P, plan.group)

    @T.macro
    def body(X, R, W, B, Y, RO, MEAN, RSTD, sxv, srv, syv, sov, eps, scale):
        with T.Kernel(T.ceildiv(M, RB), threads=plan.threads) as bx:
            if plan.min_blocks > 1:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            s = T.alloc_fragment((RB, P), F32)  # x + residual: the row normalised, residual_out
            d = T.alloc_fragment((RB, P), F32)
            mean = T.alloc_fragment((RB,), F32)
            corr = T.alloc_fragment((RB,), F32)  # LayerNorm: the mean's correction
            rstd = T.alloc_fragment((RB,), F32)
            rs = T.alloc_fragment((1,), F32)  # the fp8 scaling's factor
            wr = T.alloc_fragment((RB, P), dt) if plan.pdl and plan.has_weight else None
            br = T.alloc_fragment((RB, P), dt) if plan.pdl and plan.has_bias else None
            T.annotate_layout({s: layout, d: layout, **{f: layout for f in (wr, br) if f is not None}})
            if plan.pdl:
                T.pdl_sync()  # the kernel before it may still be writing x and the residual
            for r, j in T.Parallel(RB, P):
                s[r, j] = _load(X, dt, bx * RB + r, sxv, vec, j, (j < N) & (bx * RB + r < M))
            if R is not None:
                for r, j in T.Parallel(RB, P):
                    s[r, j] = s[r, j] + _load(R, rdt, bx * RB + r, srv, vec, j, (j < N) & (bx * RB + r < M))
            if plan.pdl:
                _load_params(plan, wr, br, W, B, RB, P)
                T.pdl_trigger()  # every load issued: the next kernel may launch (it waits for this one)
            if fp8:
                _scale_once(plan, rs, scale)
            if ln:
                # The mean, corrected by the mean of s - mean (a sum of a row of one value rounds,
                # and x^ would be that error times 1/sqrt(eps)), then the centred squares.
                T.reduce_sum(s, mean, dim=1)  # padded lanes are zero
                for r in T.Parallel(RB):
                    mean[r] = mean[r] / N
                for r, j in T.Parallel(RB, P):
                    d[r, j] = T.if_then_else(j < N, s[r, j] - mean[r], 0.0)
                T.reduce_sum(d, corr, dim=1)
                for r in T.Parallel(RB):
                    mean[r] = mean[r] + corr[r] / N
                for r, j in T.Parallel(RB, P):
                    d[r, j] = T.if_then_else(j < N, (s[r, j] - mean[r]) * (s[r, j] - mean[r]), 0.0)
            else:
                for r, j in T.Parallel(RB, P):
                    d[r, j] = s[r, j] * s[r, j]  # padded lanes are zero
            T.reduce_sum(d, rstd, dim=1)
            for r in T.Parallel(RB):
                rstd[r] = T.rsqrt(rstd[r] / N + eps)  # over N, never the padded length
            # residual_out first (each s is then dead once its y is computed), and each store in a
            # loop of its own: a loop with two stores, or with the clamp's branches, is vectorized
            # narrower (4-byte or scalar accesses).
            if RO is not None:
                for r, j in T.Parallel(RB, P):
                    if (j < N) & (bx * RB + r < M):
                        RO[T.cast(bx * RB + r, "int64") * sov * vec + j] = T.cast(s[r, j], rdt)
            if fp8:
                for r, j in T.Parallel(RB, P):
                    d[r, j] = _affine(plan, ((s[r, j] - mean[r]) if ln else s[r, j]) * rstd[r],
                                      *_params_at(plan, W, B, wr, br, r, j))
                for r, j in T.Parallel(RB, P):
                    d[r, j] = _fp8(plan, d[r, j], rs[0])
                for r, j in T.Parallel(RB, P):
                    if (j < N) & (bx * RB + r < M):
                        Y[T.cast(bx * RB + r, "int64") * syv * yvec + j] = T.cast(d[r, j], ydt)
            else:
                for r, j in T.Parallel(RB, P):
                    if (j < N) & (bx * RB + r < M):
                        Y[T.cast(bx * RB + r, "int64") * syv * yvec + j] = T.cast(
                            _affine(plan, ((s[r, j] - mean[r]) if ln else s[r, j]) * rstd[r],
                                    *_params_at(plan, W, B, wr, br, r, j)), ydt)
            for r in T.Parallel(RB):
                if bx * RB + r < M:
                    if MEAN is not None:
                        MEAN[bx * RB + r] = mean[r]
                    RSTD[bx * RB + r] = rstd[r]

    return body, M


def _two_reads(plan):
    N, K, vec, dt, rdt, segs = plan.n, plan.padded, plan.vec, plan.dtype, plan.residual_dtype, plan.segments
    ydt, fp8 = plan.out_dtype or dt, plan.out_dtype is not None
    yvec = plan.out_vec or vec
    ln = plan.layer_norm
    M = T.dynamic("M")
    layout = _row_layout(plan, 1, K, plan.group)

    @T.macro
    def body(X, R, W, B, Y, RO, MEAN, RSTD, sxv, srv, syv, sov, eps, scale):
        with T.Kernel(M, threads=plan.threads) as bx:
            if plan.min_blocks > 1:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            seg = T.alloc_fragment((1, K), F32)  # a segment of x + residual
            d = T.alloc_fragment((1, K), F32)  # RMSNorm: the squares so far; LayerNorm: scratch
            part = T.alloc_fragment((1,), F32)  # LayerNorm: a segment's sum, then its M2
            cnt = T.alloc_fragment((1,), F32)  # LayerNorm, the row's so far: count, mean, M2 (RMSNorm: m2 the sum)
            mean = T.alloc_fragment((1,), F32)
            m2 = T.alloc_fragment((1,), F32)
            sm = T.alloc_fragment((1,), F32)  # LayerNorm: the segment's mean and count
            nb = T.alloc_fragment((1,), F32)
            rs = T.alloc_fragment((1,), F32)  # the fp8 scaling's factor
            T.annotate_layout({seg: layout, d: layout})
            if fp8:
                _scale_once(plan, rs, scale)
            cnt[0] = 0.0
            mean[0] = 0.0
            m2[0] = 0.0
            for r, j in T.Parallel(1, K):
                d[r, j] = 0.0
            # "#pragma unroll 2" as splitk: fully unrolled, nvcc would hold every segment.
            for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):
                for r, j in T.Parallel(1, K):
                    seg[r, j] = _load(X, dt, bx, sxv, vec, s * K + j, s * K + j < N)
                if R is not None:
                    for r, j in T.Parallel(1, K):
                        seg[r, j] = seg[r, j] + _load(R, rdt, bx, srv, vec, s * K + j, s * K + j < N)
                if ln:  # the segment's (count, mean, M2) merged into the row's (Chan)
                    T.reduce_sum(seg, part, dim=1)  # padded lanes are zero
                    nb[0] = T.cast(T.min(N - s * K, K), F32)
                    sm[0] = part[0] / nb[0]
                    for r, j in T.Parallel(1, K):
                        d[r, j] = T.if_then_else(s * K + j < N, (seg[r, j] - sm[0]) * (seg[r, j] - sm[0]), 0.0)
                    T.reduce_sum(d, part, dim=1)
                    m2[0] = m2[0] + part[0] + (sm[0] - mean[0]) * (sm[0] - mean[0]) * cnt[0] * (nb[0] / (cnt[0] + nb[0]))
                    mean[0] = mean[0] + (sm[0] - mean[0]) * (nb[0] / (cnt[0] + nb[0]))
                    cnt[0] = cnt[0] + nb[0]
                else:
                    for r, j in T.Parallel(1, K):
                        d[r, j] += seg[r, j] * seg[r, j]
            if not ln:
                T.reduce_sum(d, m2, dim=1)
            m2[0] = T.rsqrt(m2[0] / N + eps)  # m2 now holds rstd
            for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):
                for r, j in T.Parallel(1, K):
                    seg[r, j] = _load(X, dt, bx, sxv, vec, (segs - 1 - s) * K + j, (segs - 1 - s) * K + j < N)
                if R is not None:
                    for r, j in T.Parallel(1, K):
                        seg[r, j] = seg[r, j] + _load(R, rdt, bx, srv, vec, (segs - 1 - s) * K + j,
                                                      (segs - 1 - s) * K + j < N)
                if RO is not None:  # as the one-read program: residual_out first, a loop per store
                    for r, j in T.Parallel(1, K):
                        if (segs - 1 - s) * K + j < N:
                            RO[T.cast(bx, "int64") * sov * vec + (segs - 1 - s) * K + j] = T.cast(seg[r, j], rdt)
                if fp8:
                    for r, j in T.Parallel(1, K):
                        d[r, j] = _affine(plan, ((seg[r, j] - mean[0]) if ln else seg[r, j]) * m2[0], W, B,
                                          (segs - 1 - s) * K + j)
                    for r, j in T.Parallel(1, K):
                        d[r, j] = _fp8(plan, d[r, j], rs[0])
                    for r, j in T.Parallel(1, K):
                        if (segs - 1 - s) * K + j < N:
                            Y[T.cast(bx, "int64") * syv * yvec + (segs - 1 - s) * K + j] = T.cast(d[r, j], ydt)
                else:
                    for r, j in T.Parallel(1, K):
                        if (segs - 1 - s) * K + j < N:
                            Y[T.cast(bx, "int64") * syv * yvec + (segs - 1 - s) * K + j] = T.cast(_affine(
                                plan, ((seg[r, j] - mean[0]) if ln else seg[r, j]) * m2[0], W, B,
                                (segs - 1 - s) * K + j), ydt)
            if MEAN is not None:
                MEAN[bx] = mean[0]
            RSTD[bx] = m2[0]

    return body, M


def fused_norm(plan):
    """The prim_func of a FusedPlan: its signature by op (x, residual, weight, bias, y,
    residual_out, mean, rstd, the row strides, eps, scale; only those the op has)."""
    body, M = (_one_read if plan.segments == 1 else _two_reads)(plan)
    dt, rdt, ydt = plan.dtype, plan.residual_dtype, plan.out_dtype or plan.dtype
    NW = plan.n if plan.has_weight else 1  # absent: a one-element stand-in the body never reads
    NB = plan.n if plan.has_bias else 1
    LX, LR, LY, LO = (T.dynamic(name, "int64") for name in ("LX", "LR", "LY", "LO"))
    add, ln = plan.residual_dtype is not None, plan.layer_norm

    if add and ln:
        @T.prim_func
        def main(
            X: T.Tensor((LX,), dt), R: T.Tensor((LR,), rdt), W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt),
            Y: T.Tensor((LY,), ydt), RO: T.Tensor((LO,), rdt), MEAN: T.Tensor((M,), F32), RSTD: T.Tensor((M,), F32),
            sxv: T.int64, srv: T.int64, syv: T.int64, sov: T.int64, eps: T.float32, scale: T.float32,
        ):
            body(X, R, W, B, Y, RO, MEAN, RSTD, sxv, srv, syv, sov, eps, scale)
    elif add:
        @T.prim_func
        def main(
            X: T.Tensor((LX,), dt), R: T.Tensor((LR,), rdt), W: T.Tensor((NW,), dt),
            Y: T.Tensor((LY,), ydt), RO: T.Tensor((LO,), rdt), RSTD: T.Tensor((M,), F32),
            sxv: T.int64, srv: T.int64, syv: T.int64, sov: T.int64, eps: T.float32, scale: T.float32,
        ):
            body(X, R, W, None, Y, RO, None, RSTD, sxv, srv, syv, sov, eps, scale)
    elif ln:
        @T.prim_func
        def main(
            X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt), Y: T.Tensor((LY,), ydt),
            MEAN: T.Tensor((M,), F32), RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
            scale: T.float32,
        ):
            body(X, None, W, B, Y, None, MEAN, RSTD, sxv, 0, syv, 0, eps, scale)
    else:
        @T.prim_func
        def main(
            X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), ydt), RSTD: T.Tensor((M,), F32),
            sxv: T.int64, syv: T.int64, eps: T.float32, scale: T.float32,
        ):
            body(X, None, W, None, Y, None, None, RSTD, sxv, 0, syv, 0, eps, scale)

    return main


# compiler.compile_plan finds a plan's builder here by its variant (as the candidates add theirs).
_programs.BUILDERS.setdefault(FUSED_VARIANT, fused_norm)
