"""The Triton kernels of the fused family (impls.fused): the residual add, RMSNorm or LayerNorm,
the weight offset (Gemma's 1 + w) and an fp8 output, in one pass over the row. Imported, like
_kernels, only once triton is known to load (impls.triton.fused).

A program owns ROWS rows ([ROWS, BLOCK_N] tiles, 64-bit row offsets). All arithmetic is float32:
s = x + residual, residual_out = s in its own dtype, the statistics on the float32 s (padded lanes
hold 0 and are kept out of the sums), y = s^ * (w + offset) (+ b), then y in x's dtype, or
y / scale (as y times the reciprocal taken once) clamped to the fp8 format's maximum and cast.
At the decode setting a launch may use PDL (impls.pdl), and the weight is loaded with x.

- fused_norm_rowwise: the row in one tile: loaded once, everything written after the loads.
- fused_norm_looped: the row in chunks (N a constant, as the plain looped kernels). Pass 1 only
  reads (the statistics); pass 2 reads x and residual again, chunk by chunk, and writes that
  chunk's residual_out and y. Written in place (y into x, residual_out into residual), every chunk
  is read before it is overwritten and never read again; and the float32 s is recomputed from x +
  residual, not read back from residual_out, which may hold it rounded.

STATS_ONLY (either kernel): mean and rstd alone, nothing else written: the backward's statistics
of a rounded residual_out.

fused_bwd_add: the backward's last step: dx (float32, from the plain backward kernels) plus
residual_out's gradient, stored as dx and dresidual in their own dtypes.
"""
import triton
import triton.language as tl

from impls.triton._row_kernels import _dependent_launch, _store_y


@triton.jit
def _fp8_round_interpreted(y, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """y rounded to nearest even at the fp8 format's precision (MBITS mantissa bits, smallest
    normal exponent EMIN), in float32. For the interpreter only: its float32-to-fp8 cast truncates
    (and carries no rounding into the exponent), but is exact on values the format holds. Adding
    and subtracting 2^23 ulps makes the float32 add round to the fp8 ulp."""
    a = tl.abs(y)
    e = ((a.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    e = tl.where(e < EMIN, EMIN, e)  # below the normal range the ulp stays the subnormal step
    big = ((e + (23 - MBITS + 127)) << 23).to(tl.float32, bitcast=True)
    r = (a + big) - big
    return tl.where(y < 0, -r, r)


@triton.jit
def _store_out(Y, offsets, y, mask, scale, fp8_max, FP8: tl.constexpr, ROUND_BF16: tl.constexpr,
               FP8_FIX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, FP8_RECIP: tl.constexpr):
    """Store float32 y as the op's output: in Y's dtype, or for an fp8 Y divided by the scale and
    clamped to +-fp8_max first (a cast past the maximum gives NaN or inf). The clamp is tl.where,
    not tl.minimum/maximum, which on the GPU may drop a NaN: NaN stays NaN.

    FP8_RECIP: ``scale`` holds 1 / scale (float32, taken once on the host) and y is multiplied by
    it: one multiply an element where a correctly rounded division is a sequence of them. It
    differs from y / scale by at most an ulp of float32, far inside the fp8 rule's band at a
    rounding midpoint. Otherwise y / scale correctly rounded (tl.div_rn: a plain / is
    approximate on the GPU)."""
    if FP8:
        if FP8_RECIP:
            y = y * scale
        else:
            y = tl.div_rn(y, scale)
        y = tl.where(y > fp8_max, fp8_max, tl.where(y < -fp8_max, -fp8_max, y))
        if FP8_FIX:  # under the interpreter: round by hand, then put back NaN and a zero's sign
            q = _fp8_round_interpreted(y, MBITS, EMIN).to(Y.dtype.element_ty)
            bits = q.to(tl.uint8, bitcast=True) | ((y.to(tl.uint32, bitcast=True) >> 31) << 7).to(tl.uint8)
            bits = tl.where(y != y, 0x7F, bits).to(tl.uint8)  # the interpreter's cast makes e4m3fn's NaN 384
            tl.store(Y + offsets, bits.to(Y.dtype.element_ty, bitcast=True), mask=mask)
        else:
            tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)
    else:
        _store_y(Y, offsets, y, mask, ROUND_BF16)


@triton.jit
def _load_sum(X, R, xoff, roff, cols, mask, HAS_RES: tl.constexpr):
    """s = x (+ residual) of a tile, float32, 0 in masked lanes."""
    s = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        s += tl.load(R + roff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _load_wb(W, B, cols, cmask, w_offset, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The effective weight (w + offset) and the bias of a tile's columns, float32 (1.0 and 0.0
    where absent: never applied)."""
    w = 1.0
    b = 0.0
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + w_offset
    if HAS_BIAS:
        b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
    return w, b


@triton.jit
def _apply_wb(y, w, b, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    if HAS_WEIGHT:
        y = y * w[None, :]
    if HAS_BIAS:
        y = y + b[None, :]
    return y


@triton.jit
def _affine(y, W, B, cols, cmask, w_offset, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    w, b = _load_wb(W, B, cols, cmask, w_offset, HAS_WEIGHT, HAS_BIAS)
    return _apply_wb(y, w, b, HAS_WEIGHT, HAS_BIAS)


@triton.jit
def _offsets(M, stride_x, stride_r, stride_y, stride_ro, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rows64 = rows.to(tl.int64)  # before the multiply: M * stride may pass 2**31
    return rows, rows < M, rows64 * stride_x, rows64 * stride_r, rows64 * stride_y, rows64 * stride_ro


@triton.jit
def fused_norm_rowwise(
    X, R, W, B, Y, RO, MEAN, RSTD, M, N, stride_x, stride_r, stride_y, stride_ro, eps, w_offset, scale, fp8_max,
    IS_LN: tl.constexpr, HAS_RES: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    FP8: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_Y: tl.constexpr, ROUND_R: tl.constexpr,
    FP8_FIX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, STATS_ONLY: tl.constexpr,
    FP8_RECIP: tl.constexpr = True, W_FIRST: tl.constexpr = False, PDL: tl.constexpr = False,
):
    _dependent_launch(PDL)
    rows, rmask, xoff, roff, yoff, rooff = _offsets(M, stride_x, stride_r, stride_y, stride_ro, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    # W_FIRST (the decode setting: few rows, latency the cost): the weight and bias loads are
    # issued with x's, so their round trips overlap; with many rows they would only hold
    # registers through the reductions.
    if W_FIRST and not STATS_ONLY:
        w, b = _load_wb(W, B, cols, cmask, w_offset, HAS_WEIGHT, HAS_BIAS)
    s = _load_sum(X, R, xoff, roff, cols, mask, HAS_RES)  # every load before any store (in place)
    if HAS_RES:
        _store_y(RO, rooff[:, None] + cols[None, :], s, mask, ROUND_R)
    if IS_LN:
        # Two-pass, corrected: centred on the mean, then on what the centred row still sums to
        # (the mean's rounding). A row of one value then gives x^ = 0 up to that rounding's own
        # rounding: the mean of N equal values need not be exact on the GPU, and its error would
        # come back times rstd = 1/sqrt(eps) in y.
        mean = tl.sum(s, axis=1) / N
        s = tl.where(mask, s - mean[:, None], 0.0)  # padding 0
        c = tl.sum(s, axis=1) / N
        s = tl.where(mask, s - c[:, None], 0.0)
        tl.store(MEAN + rows, mean + c, mask=rmask)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
    if not STATS_ONLY:
        if not W_FIRST:
            w, b = _load_wb(W, B, cols, cmask, w_offset, HAS_WEIGHT, HAS_BIAS)
        y = _apply_wb(s * rstd[:, None], w, b, HAS_WEIGHT, HAS_BIAS)
        _store_out(Y, yoff[:, None] + cols[None, :], y, mask, scale, fp8_max, FP8, ROUND_Y, FP8_FIX, MBITS, EMIN,
                   FP8_RECIP)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def fused_norm_looped(
    X, R, W, B, Y, RO, MEAN, RSTD, M, N: tl.constexpr, stride_x, stride_r, stride_y, stride_ro, eps, w_offset,
    scale, fp8_max,
    IS_LN: tl.constexpr, HAS_RES: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    FP8: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_Y: tl.constexpr, ROUND_R: tl.constexpr,
    FP8_FIX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, STATS_ONLY: tl.constexpr,
    FP8_RECIP: tl.constexpr = True, W_FIRST: tl.constexpr = False, PDL: tl.constexpr = False,
):
    _dependent_launch(PDL)
    rows, rmask, xoff, roff, yoff, rooff = _offsets(M, stride_x, stride_r, stride_y, stride_ro, ROWS)
    chunks: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    first: tl.constexpr = N if N < BLOCK_N else BLOCK_N  # columns of the first chunk
    # Pass 1, reads only: per-lane float32 sums, reduced once at the end. LayerNorm sums s - k,
    # k the first chunk's mean (as layer_norm_looped): no large common part, so
    # E[(s-k)^2] - E[s-k]^2 keeps float32 precision on large-mean rows.
    cols = tl.arange(0, BLOCK_N)
    mask = rmask[:, None] & (cols < N)[None, :]
    s = _load_sum(X, R, xoff, roff, cols, mask, HAS_RES)
    if IS_LN:
        k = tl.sum(s, axis=1) / first
        s = tl.where(mask, s - k[:, None], 0.0)
        s1 = s
    else:
        k = tl.zeros([ROWS], dtype=tl.float32)  # never read
        s1 = s  # never read
    s2 = s * s
    for c in tl.range(1, chunks):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < N)[None, :]
        s = _load_sum(X, R, xoff, roff, cols, mask, HAS_RES)
        if IS_LN:
            s = tl.where(mask, s - k[:, None], 0.0)
            s1 += s
        s2 += s * s
    if IS_LN:
        mean_s = tl.sum(s1, axis=1) / N
        var = tl.sum(s2, axis=1) / N - mean_s * mean_s
        var = tl.where(var < 0.0, 0.0, var)  # rounding below zero; tl.where keeps a NaN
        tl.store(MEAN + rows, k + mean_s, mask=rmask)
    else:
        mean_s = k  # never read
        var = tl.sum(s2, axis=1) / N
    rstd = tl.rsqrt(var + eps)
    # Pass 2: each chunk's x and residual read, then its residual_out and y written (in place:
    # over what was just read, which no later chunk needs). s recomputed in float32.
    if not STATS_ONLY:
        for c in tl.range(0, chunks):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = rmask[:, None] & cmask[None, :]
            s = _load_sum(X, R, xoff, roff, cols, mask, HAS_RES)
            if HAS_RES:
                _store_y(RO, rooff[:, None] + cols[None, :], s, mask, ROUND_R)
            if IS_LN:
                s = (s - k[:, None]) - mean_s[:, None]
            y = _affine(s * rstd[:, None], W, B, cols, cmask, w_offset, HAS_WEIGHT, HAS_BIAS)
            _store_out(Y, yoff[:, None] + cols[None, :], y, mask, scale, fp8_max, FP8, ROUND_Y, FP8_FIX, MBITS,
                       EMIN, FP8_RECIP)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def fused_bwd_add(
    DS, DRO, DX, DRES, M, N, stride_ds, stride_dro, stride_dx, stride_dres,
    HAS_DRO: tl.constexpr, HAS_DRES: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    ROUND_DX: tl.constexpr, ROUND_DRES: tl.constexpr,
):
    """dx = ds + d_residual_out (float32, rounded once), stored as dx and as dresidual."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows64 = rows.to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    g = tl.load(DS + rows64[:, None] * stride_ds + cols[None, :], mask=mask, other=0.0)
    if HAS_DRO:
        g += tl.load(DRO + rows64[:, None] * stride_dro + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    _store_y(DX, rows64[:, None] * stride_dx + cols[None, :], g, mask, ROUND_DX)
    if HAS_DRES:
        _store_y(DRES, rows64[:, None] * stride_dres + cols[None, :], g, mask, ROUND_DRES)
