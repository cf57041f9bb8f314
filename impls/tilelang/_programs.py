"""The TileLang programs of the four kernels, one builder per kernel.

Imported only when a kernel is compiled (importing tilelang takes seconds). Every builder
takes a ``Plan`` (impls.tilelang.plan) and returns a ``T.prim_func``.

Conventions shared by all four:

- x and y are passed as flat 1-D views of their storage, and the row strides as runtime
  integers in units of the vector width ``vec`` (``sxv``, ``syv``). The address of row r is
  then ``r * sxv * vec``: TileLang's vectorizer can prove it a multiple of ``vec`` and emit
  16-byte loads and stores for any row stride the host found divisible by ``vec``. A symbolic
  stride on a 2-D tensor would give scalar accesses only.
- M (rows) is symbolic: it is bound from rstd's shape, so one compilation serves every M.
- Rows are padded inside the kernel to ``plan.padded`` columns (a multiple of threads x vec):
  padded lanes and rows past M read as zero and are never stored. Every global load and store
  carries its own guard, so TileLang's own bounds legalisation (which would check each element
  separately and defeat vectorization) is switched off at compile time.
- The raw row is loaded in the input dtype (a guarded select of the same dtype, so the load
  itself sits inside the guard) and converted to float32 where it is used.
- weight and bias absent: the parameter still exists (shape (1,)) but the body never reads it.
"""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang._bwd_programs import norm_bwd
from impls.tilelang._long_programs import BUILDERS as LONG_BUILDERS
from impls.tilelang._program_parts import F32, _affine, _load_params, _params_at, _row_layout, _signature_sizes
from impls.tilelang.plan import Plan


def rms_norm_fragment(plan: Plan):
    """One read of x: the padded row lives in a register fragment between the reduction and
    the scaling. ``plan.rows_per_block`` rows per block for short rows."""
    N, R, P, vec, dt = plan.n, plan.rows_per_block, plan.padded, plan.vec, plan.dtype
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w = plan.has_weight

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), dt),
        RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(M, R), threads=plan.threads) as bx:
            if plan.min_blocks:  # only where a plan sets it (tools/tilelang_sweep.py)
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            xr = T.alloc_fragment((R, P), dt)
            sq = T.alloc_fragment((R, P), F32)
            ss = T.alloc_fragment((R,), F32)
            wr = T.alloc_fragment((R, P), dt) if plan.pdl and has_w else None
            T.annotate_layout({xr: _row_layout(plan, R, P), sq: _row_layout(plan, R, P),
                               **({wr: _row_layout(plan, R, P)} if wr is not None else {})})
            if plan.pdl:
                T.pdl_sync()  # the kernel before it may still be writing x
            for r, j in T.Parallel(R, P):
                xr[r, j] = T.if_then_else(
                    (j < N) & (bx * R + r < M), X[T.cast(bx * R + r, "int64") * sxv * vec + j], T.cast(0, dt))
            if plan.pdl:
                _load_params(plan, wr, None, W, None, R, P)
                T.pdl_trigger()  # every load issued: the next kernel may launch (it waits for this one)
            for r, j in T.Parallel(R, P):
                sq[r, j] = T.cast(xr[r, j], F32) * T.cast(xr[r, j], F32)
            T.reduce_sum(sq, ss, dim=1)
            for r in T.Parallel(R):
                ss[r] = T.rsqrt(ss[r] / N + eps)  # divide by N, never by the padded length
            for r, j in T.Parallel(R, P):
                if (j < N) & (bx * R + r < M):
                    Y[T.cast(bx * R + r, "int64") * syv * vec + j] = T.cast(
                        _affine(T.cast(xr[r, j], F32) * ss[r], *_params_at(plan, W, None, wr, None, r, j),
                                has_w, False), dt)
            for r in T.Parallel(R):
                if bx * R + r < M:
                    RSTD[bx * R + r] = ss[r]

    return main


def rms_norm_naive(plan: Plan):
    """Two reads of x, one row per block: each thread sums the squares of the columns it
    strides over into its own slot of a shared-memory array (the intermediate), the slots are
    reduced, then x is read again to scale it. Scalar, coalesced accesses; any N."""
    N, TH, dt = plan.n, plan.threads, plan.dtype
    chunks = -(-N // TH)
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w = plan.has_weight

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), dt),
        RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(M, threads=TH) as bx:
            part = T.alloc_shared((TH,), F32)
            part_f = T.alloc_fragment((TH,), F32)
            ss = T.alloc_fragment((1,), F32)
            for t in T.Parallel(TH):
                part[t] = 0.0
            for c in T.serial(chunks):
                for t in T.Parallel(TH):
                    if c * TH + t < N:
                        part[t] += T.cast(X[T.cast(bx, "int64") * sxv + c * TH + t], F32) * T.cast(
                            X[T.cast(bx, "int64") * sxv + c * TH + t], F32)
            T.copy(part, part_f)
            T.reduce_sum(part_f, ss, dim=0)
            ss[0] = T.rsqrt(ss[0] / N + eps)
            for c in T.serial(chunks):
                for t in T.Parallel(TH):
                    if c * TH + t < N:
                        Y[T.cast(bx, "int64") * syv + c * TH + t] = T.cast(_affine(
                            T.cast(X[T.cast(bx, "int64") * sxv + c * TH + t], F32) * ss[0],
                            W, None, c * TH + t, has_w, False), dt)
            RSTD[bx] = ss[0]

    return main


def rms_norm_splitk(plan: Plan):
    """Two reads of x, one row per block, in segments of ``plan.padded`` columns (blk_k): the
    first pass accumulates squares elementwise into a fragment of one segment and reduces it
    once; the second pass walks the segments in reverse, so the segments read last in the first
    pass (still in L2) are scaled first. Any N."""
    N, K, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype
    segs = -(-N // K)
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w = plan.has_weight

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), dt),
        RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(M, threads=plan.threads) as bx:
            seg = T.alloc_fragment((1, K), dt)
            acc = T.alloc_fragment((1, K), F32)
            ss = T.alloc_fragment((1,), F32)
            T.annotate_layout({seg: _row_layout(plan, 1, K), acc: _row_layout(plan, 1, K)})
            for r, j in T.Parallel(1, K):
                acc[r, j] = 0.0
            # "#pragma unroll 2": nvcc unrolls a short constant trip count fully otherwise, and
            # then holds every segment in registers (254 per thread at float32 N=65536).
            for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):
                for r, j in T.Parallel(1, K):
                    seg[r, j] = T.if_then_else(
                        s * K + j < N, X[T.cast(bx, "int64") * sxv * vec + s * K + j], T.cast(0, dt))
                for r, j in T.Parallel(1, K):
                    acc[r, j] += T.cast(seg[r, j], F32) * T.cast(seg[r, j], F32)
            T.reduce_sum(acc, ss, dim=1)
            ss[0] = T.rsqrt(ss[0] / N + eps)
            for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):
                for r, j in T.Parallel(1, K):
                    seg[r, j] = T.if_then_else(
                        (segs - 1 - s) * K + j < N,
                        X[T.cast(bx, "int64") * sxv * vec + (segs - 1 - s) * K + j], T.cast(0, dt))
                for r, j in T.Parallel(1, K):
                    if (segs - 1 - s) * K + j < N:
                        Y[T.cast(bx, "int64") * syv * vec + (segs - 1 - s) * K + j] = T.cast(_affine(
                            T.cast(seg[r, j], F32) * ss[0], W, None, (segs - 1 - s) * K + j, has_w, False), dt)
            RSTD[bx] = ss[0]

    return main


def layer_norm_fwd(plan: Plan):
    """One read of x, the padded row in a register fragment. Mean first, then the variance of
    the centred row (padded lanes centred to zero, not to -mean), both over N: no
    E[x^2] - E[x]^2 cancellation on large-mean rows (nor on rows whose first element is far
    from the mean, which a shift by x[row, 0] would suffer).

    Speed comes from occupancy: TileLang's default ``__launch_bounds__(threads, 1)`` let ptxas
    spend 46-80 registers, leaving 1-4 blocks per SM and 24-36 KB of x in flight, where HBM
    wants more. The plan gives each thread about 4 vectors (2 for N <= 2048), and the launch
    bound ``ln_min_blocks_per_sm`` holds ptxas to 40 or 64 registers."""
    from impls.tilelang.plan import ln_min_blocks_per_sm

    N, R, P, vec, dt = plan.n, plan.rows_per_block, plan.padded, plan.vec, plan.dtype
    NW, NB = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w, has_b = plan.has_weight, plan.has_bias
    min_blocks = ln_min_blocks_per_sm(plan)

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt), Y: T.Tensor((LY,), dt),
        MEAN: T.Tensor((M,), F32), RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(M, R), threads=plan.threads) as bx:
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            xr = T.alloc_fragment((R, P), dt)
            d = T.alloc_fragment((R, P), F32)
            mean = T.alloc_fragment((R,), F32)
            var = T.alloc_fragment((R,), F32)
            wr = T.alloc_fragment((R, P), dt) if plan.pdl and has_w else None
            br = T.alloc_fragment((R, P), dt) if plan.pdl and has_b else None
            T.annotate_layout({xr: _row_layout(plan, R, P), d: _row_layout(plan, R, P),
                               **{f: _row_layout(plan, R, P) for f in (wr, br) if f is not None}})
            if plan.pdl:
                T.pdl_sync()  # the kernel before it may still be writing x
            for r, j in T.Parallel(R, P):
                xr[r, j] = T.if_then_else(
                    (j < N) & (bx * R + r < M), X[T.cast(bx * R + r, "int64") * sxv * vec + j], T.cast(0, dt))
            if plan.pdl:
                _load_params(plan, wr, br, W, B, R, P)
                T.pdl_trigger()  # every load issued: the next kernel may launch (it waits for this one)
            for r, j in T.Parallel(R, P):
                d[r, j] = T.cast(xr[r, j], F32)
            T.reduce_sum(d, mean, dim=1)
            for r in T.Parallel(R):
                mean[r] = mean[r] / N
            for r, j in T.Parallel(R, P):
                d[r, j] = T.if_then_else(j < N, (T.cast(xr[r, j], F32) - mean[r]) * (T.cast(xr[r, j], F32) - mean[r]), 0.0)
            T.reduce_sum(d, var, dim=1)
            for r in T.Parallel(R):
                var[r] = T.rsqrt(var[r] / N + eps)  # var now holds rstd
            for r, j in T.Parallel(R, P):
                if (j < N) & (bx * R + r < M):
                    Y[T.cast(bx * R + r, "int64") * syv * vec + j] = T.cast(
                        _affine((T.cast(xr[r, j], F32) - mean[r]) * var[r], *_params_at(plan, W, B, wr, br, r, j),
                                has_w, has_b), dt)
            for r in T.Parallel(R):
                if bx * R + r < M:
                    MEAN[bx * R + r] = mean[r]
                    RSTD[bx * R + r] = var[r]

    return main


def layer_norm_long(plan: Plan):
    """layer_norm_fwd beyond the register capacity (FRAGMENT_MAX_N): two reads of x, one row per
    block, in segments of ``plan.padded`` columns. The first pass reduces each segment to its
    (count, mean, M2), the mean first and then the centred squares (both from the segment in
    registers), and merges them into the row's with Chan's formula: no E[x^2] - E[x]^2
    cancellation on large-mean rows. Padded lanes are outside every count and sum. The second pass
    walks the segments in reverse (the last read are still in L2) and normalises them."""
    N, K, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype
    segs = -(-N // K)
    NW, NB = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w, has_b = plan.has_weight, plan.has_bias

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt), Y: T.Tensor((LY,), dt),
        MEAN: T.Tensor((M,), F32), RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(M, threads=plan.threads) as bx:
            seg = T.alloc_fragment((1, K), dt)
            d = T.alloc_fragment((1, K), F32)
            part = T.alloc_fragment((1,), F32)  # a segment's sum, then its M2
            cnt = T.alloc_fragment((1,), F32)  # the row's so far: count, mean, M2
            mean = T.alloc_fragment((1,), F32)
            m2 = T.alloc_fragment((1,), F32)
            sm = T.alloc_fragment((1,), F32)  # the segment's count and mean
            nb = T.alloc_fragment((1,), F32)
            T.annotate_layout({seg: _row_layout(plan, 1, K), d: _row_layout(plan, 1, K)})
            cnt[0] = 0.0
            mean[0] = 0.0
            m2[0] = 0.0
            for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):  # as splitk: not fully
                for r, j in T.Parallel(1, K):
                    seg[r, j] = T.if_then_else(
                        s * K + j < N, X[T.cast(bx, "int64") * sxv * vec + s * K + j], T.cast(0, dt))
                for r, j in T.Parallel(1, K):
                    d[r, j] = T.cast(seg[r, j], F32)
                T.reduce_sum(d, part, dim=1)
                nb[0] = T.cast(T.min(N - s * K, K), F32)  # K, or what is left of the row in the last segment
                sm[0] = part[0] / nb[0]
                for r, j in T.Parallel(1, K):
                    d[r, j] = T.if_then_else(
                        s * K + j < N, (T.cast(seg[r, j], F32) - sm[0]) * (T.cast(seg[r, j], F32) - sm[0]), 0.0)
                T.reduce_sum(d, part, dim=1)
                # Chan: n = na + nb, M2 += M2b + delta^2 na nb / n, mean += delta nb / n
                m2[0] = m2[0] + part[0] + (sm[0] - mean[0]) * (sm[0] - mean[0]) * cnt[0] * (nb[0] / (cnt[0] + nb[0]))
                mean[0] = mean[0] + (sm[0] - mean[0]) * (nb[0] / (cnt[0] + nb[0]))
                cnt[0] = cnt[0] + nb[0]
            m2[0] = T.rsqrt(m2[0] / N + eps)  # m2 now holds rstd
            for s in T.unroll(segs, annotations={"pragma_unroll_factor": 2}):
                for r, j in T.Parallel(1, K):
                    seg[r, j] = T.if_then_else(
                        (segs - 1 - s) * K + j < N,
                        X[T.cast(bx, "int64") * sxv * vec + (segs - 1 - s) * K + j], T.cast(0, dt))
                for r, j in T.Parallel(1, K):
                    if (segs - 1 - s) * K + j < N:
                        Y[T.cast(bx, "int64") * syv * vec + (segs - 1 - s) * K + j] = T.cast(_affine(
                            (T.cast(seg[r, j], F32) - mean[0]) * m2[0], W, B, (segs - 1 - s) * K + j, has_w, has_b), dt)
            MEAN[bx] = mean[0]
            RSTD[bx] = m2[0]

    return main


BUILDERS = {
    "naive_row_per_block": rms_norm_naive,
    "fragment": rms_norm_fragment,
    "splitk": rms_norm_splitk,
    "layer_norm_fwd": layer_norm_fwd,
    "layer_norm_long": layer_norm_long,
    "rms_norm_bwd": norm_bwd,
    "layer_norm_bwd": norm_bwd,
    **LONG_BUILDERS,  # the cluster kernels
}
