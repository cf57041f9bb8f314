"""The Triton kernels that run a row in one program: rowwise (the row in one tile) and looped (the
row in chunks). Imported through _kernels, once triton is known to import.

Every kernel works on a [ROWS, BLOCK_N] tile: ROWS rows of one program, BLOCK_N columns.
Loads are masked (rows >= M, columns >= N) with 0 as the fill, and every sum over columns
sees 0 in padded lanes, so statistics divide by N, never by the padded width. Accumulation
and statistics are float32; y is stored in x's dtype. Row offsets are 64-bit.

The rowwise kernels have a 1-D form for one row per program (rms_norm_row, layer_norm_row).
The looped and LayerNorm rowwise kernels take N as a compile-time constant (one compilation per
N, as the TileLang kernels have it): the chunk count is then known, which measured much faster
(docs/perf-notes.md, item 15). It also gives the interpreter a Python int loop bound, which it
needs. The rowwise LayerNorm measured slightly faster with a static N (item 21); the rowwise
RMSNorm did not, and keeps N a runtime value.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _store_y(Y, offsets, y, mask, ROUND_BF16: tl.constexpr):
    """Store float32 y in Y's dtype. The interpreter casts float32 to bfloat16 by truncation
    where the GPU rounds to nearest even; ROUND_BF16 (set under the interpreter only) rounds to
    nearest even by hand first, so the cast is exact and the numerics are the GPU's."""
    if ROUND_BF16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = bits.to(tl.float32, bitcast=True)
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _dependent_launch(PDL: tl.constexpr):
    """Launched with PDL (impls.pdl), the program may start while the kernel before it still
    runs: wait until that kernel's writes are visible before any load, then let the kernel after
    this one start early. Under the interpreter PDL is always off (it cannot run griddepcontrol)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _row_offsets(pid, M, stride_x, stride_y, ROWS: tl.constexpr):
    rows = pid * ROWS + tl.arange(0, ROWS)
    rows64 = rows.to(tl.int64)  # before the multiply: M * stride may pass 2**31
    return rows, rows < M, rows64 * stride_x, rows64 * stride_y


# -- RMSNorm ------------------------------------------------------------------------------------
@triton.jit
def rms_norm_rowwise(
    X, W, Y, RSTD, M, N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, W_FIRST: tl.constexpr,
    ROUND_BF16: tl.constexpr, PDL: tl.constexpr = False,
):
    _dependent_launch(PDL)
    rows, rmask, xoff, yoff = _row_offsets(tl.program_id(0), M, stride_x, stride_y, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    # W_FIRST (a grid of few rows, where latency is the cost): the weight's load is issued with
    # x's, not after the reduction, so the two memory round trips overlap. With many rows it
    # would only hold registers through the reduction.
    if HAS_WEIGHT and W_FIRST:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        if not W_FIRST:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    _store_y(Y, yoff[:, None] + cols[None, :], y, mask, ROUND_BF16)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def rms_norm_row(
    X, W, Y, RSTD, M, N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, W_FIRST: tl.constexpr, ROUND_BF16: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """rms_norm_rowwise at one row per program (the grid is M): 1-D, the row's offset a scalar and
    no row mask, the same arithmetic. The launcher runs it at decode sizes and where its register
    count gives more blocks per SM than the tile's (docs/perf-notes.md, items 26 and 31)."""
    _dependent_launch(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_WEIGHT and W_FIRST:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(RSTD + row, rstd)  # before y: sooner done at decode sizes (docs/perf-notes.md, item 26)
    y = x * rstd
    if HAS_WEIGHT:
        if not W_FIRST:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y * w
    _store_y(Y, row * stride_y + cols, y, cmask, ROUND_BF16)


@triton.jit
def rms_norm_looped(
    X, W, Y, RSTD, M, N: tl.constexpr, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    rows, rmask, xoff, yoff = _row_offsets(tl.program_id(0), M, stride_x, stride_y, ROWS)
    chunks: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    # Pass 1: per-lane float32 sums of squares, reduced once at the end. x is loaded with
    # evict_last so it is still in L2 when pass 2 reads it again.
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for c in tl.range(0, chunks):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < N)[None, :]
        x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
    # Pass 2: normalise and write, last chunk first: the chunks pass 1 read last are the likeliest
    # to be in L2 still. x and y are done with after this, so they leave L2 first.
    for c in tl.range(0, chunks):
        cols = (chunks - 1 - c) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = x * rstd[:, None]
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
            y = y * w[None, :]
        _store_y(Y, yoff[:, None] + cols[None, :], y, mask, ROUND_BF16)
    tl.store(RSTD + rows, rstd, mask=rmask)


# -- LayerNorm ----------------------------------------------------------------------------------
# The rowwise kernel holds the row in registers: the mean, then the variance of the centred row
# (two plain reductions; no E[x^2] - E[x]^2, so large-mean rows do not cancel). The looped kernel
# cannot hold the row and works on s = x - k, k the first chunk's mean: for rows with a large mean
# (1e4 + noise) s is small and exact, so neither its mean nor its variance loses the noise to
# float32 rounding at the mean's magnitude.
@triton.jit
def layer_norm_rowwise(
    X, W, B, Y, MEAN, RSTD, M, N: tl.constexpr, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    W_FIRST: tl.constexpr, ROUND_BF16: tl.constexpr, PDL: tl.constexpr = False,
):
    _dependent_launch(PDL)
    rows, rmask, xoff, yoff = _row_offsets(tl.program_id(0), M, stride_x, stride_y, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    if W_FIRST:  # weight and bias loaded with x (see rms_norm_rowwise)
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
    x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N  # padded lanes hold 0
    xc = tl.where(mask, x - mean[:, None], 0.0)  # padded lanes would hold -mean
    # The mean's own rounding (a few ulps of a large mean) enters y as that much of an input
    # perturbation, which is all the input's precision holds; a correction term for it (a pair
    # reduction) measured slower at decode sizes (docs/perf-notes.md, item 22).
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    y = xc * rstd[:, None]
    if HAS_WEIGHT:
        if not W_FIRST:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_BIAS:
        if not W_FIRST:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y + b[None, :]
    _store_y(Y, yoff[:, None] + cols[None, :], y, mask, ROUND_BF16)
    tl.store(MEAN + rows, mean, mask=rmask)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def layer_norm_row(
    X, W, B, Y, MEAN, RSTD, M, N: tl.constexpr, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, W_FIRST: tl.constexpr,
    ROUND_BF16: tl.constexpr, PDL: tl.constexpr = False,
):
    """layer_norm_rowwise at one row per program (see rms_norm_row)."""
    _dependent_launch(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if W_FIRST:
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(cmask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)
    tl.store(MEAN + row, mean)  # before y, as in rms_norm_row
    tl.store(RSTD + row, rstd)
    y = xc * rstd
    if HAS_WEIGHT:
        if not W_FIRST:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y * w
    if HAS_BIAS:
        if not W_FIRST:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y + b
    _store_y(Y, row * stride_y + cols, y, cmask, ROUND_BF16)


@triton.jit
def layer_norm_looped(
    X, W, B, Y, MEAN, RSTD, M, N: tl.constexpr, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    rows, rmask, xoff, yoff = _row_offsets(tl.program_id(0), M, stride_x, stride_y, ROWS)
    chunks: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    first: tl.constexpr = N if N < BLOCK_N else BLOCK_N  # columns of the first chunk
    # Pass 1: per-lane sums of s = x - k and of s^2, reduced once at the end (as RMSNorm's sum of
    # squares: a few operations per element, no block reduction per chunk). The shift k is the
    # mean of the first chunk, so s carries no large common part and var = E[s^2] - E[s]^2 keeps
    # float32 precision, large-mean rows included; it would lose it only where the rest of the
    # row's mean lay many standard deviations from the first chunk's.
    cols = tl.arange(0, BLOCK_N)
    mask = rmask[:, None] & (cols < N)[None, :]
    x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    k = tl.sum(x, axis=1) / first
    sh = tl.where(mask, x - k[:, None], 0.0)
    s1 = sh
    s2 = sh * sh
    for c in tl.range(1, chunks):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < N)[None, :]
        x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        sh = tl.where(mask, x - k[:, None], 0.0)
        s1 += sh
        s2 += sh * sh
    mean_s = tl.sum(s1, axis=1) / N
    var = tl.sum(s2, axis=1) / N - mean_s * mean_s
    var = tl.where(var < 0.0, 0.0, var)  # rounding below zero; not tl.maximum: on the GPU it drops NaN
    rstd = tl.rsqrt(var + eps)
    # Pass 2: normalise and write, last chunk first (still in L2, see rms_norm_looped).
    for c in tl.range(0, chunks):
        cols = (chunks - 1 - c) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(X + xoff[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = ((x - k[:, None]) - mean_s[:, None]) * rstd[:, None]
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
            y = y * w[None, :]
        if HAS_BIAS:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
            y = y + b[None, :]
        _store_y(Y, yoff[:, None] + cols[None, :], y, mask, ROUND_BF16)
    tl.store(MEAN + rows, k + mean_s, mask=rmask)
    tl.store(RSTD + rows, rstd, mask=rmask)
