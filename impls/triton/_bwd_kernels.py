"""The Triton backward kernels (imported, like _kernels, only once triton is known to load).

With x^ = (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm), mean and rstd the forward's saved
ones (never recomputed), and g = dy * w (dy without a weight):

    dx = rstd * (g - c2 - x^ * c1),  c1 = sum(g * x^) / N,  c2 = sum(g) / N (LayerNorm only)
    dw = sum over rows of dy * x^,   db = sum over rows of dy

One pass over x and dy: program p owns rows [p * BLOCK_M, (p + 1) * BLOCK_M), walks them in
[ROWS, BLOCK_N] tiles (tiles ahead in flight during a tile's arithmetic: bwd_rows), writes each
row's dx and adds the tile's dy * x^ and dy into [ROWS, BLOCK_N] float32 accumulators. Padded
lanes are zeroed with tl.where before any row sum: x loads 0 there, and x^ = (0 - mean) * rstd
would otherwise enter c1. A row's dx depends on its own row only (same tile at every M).

dw, db: at the end program p sums its accumulators over their ROWS rows and writes row p of the
float32 partials; ``bwd_reduce`` then sums the partials of each column in program order. No
atomics: the same inputs give the same bits, and BLOCK_M and ROWS come from N and dtype only
(never from M), so the grouping of rows into partials never moves.

Two forms of the row kernel: ONE_TILE (BLOCK_N covers N) computes c1 and c2 in the tile; otherwise
``bwd_row_stats`` first writes c1 and c2 per row (looping over the row in chunks), and the row
kernel's grid also splits the columns. Offsets are 64-bit, as in the forward.
"""
import triton
import triton.language as tl

from impls.triton._row_kernels import _store_y


@triton.jit
def _tile(X, DY, W, MEAN, RSTD, rows, rmask, cols, cmask, stride_x, stride_dy,
          HAS_WEIGHT: tl.constexpr, IS_LN: tl.constexpr):
    """x^, g, dy and rstd of a [ROWS, BLOCK_N] tile, zero in padded lanes and rows past M."""
    rows64 = rows.to(tl.int64)
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    if IS_LN:
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    else:
        xhat = tl.where(mask, x * rstd[:, None], 0.0)
    g = dy
    if HAS_WEIGHT:
        g = dy * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return xhat, g, dy, rstd, mask


@triton.jit
def bwd_row_stats(
    X, DY, W, MEAN, RSTD, C1, C2, M, N: tl.constexpr, stride_x, stride_dy,
    HAS_WEIGHT: tl.constexpr, IS_LN: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """c1 and c2 of ROWS rows per program, for rows longer than one tile (N a constant, as in
    the looped forward: the chunk count is then known)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    s1 = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    s2 = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for c in tl.range(0, (N + BLOCK_N - 1) // BLOCK_N):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        xhat, g, dy, rstd, mask = _tile(X, DY, W, MEAN, RSTD, rows, rmask, cols, cols < N, stride_x, stride_dy,
                                        HAS_WEIGHT, IS_LN)
        s1 += g * xhat
        s2 += g
    tl.store(C1 + rows, tl.sum(s1, axis=1) / N, mask=rmask)
    tl.store(C2 + rows, tl.sum(s2, axis=1) / N, mask=rmask)


@triton.jit
def bwd_rows(
    X, DY, W, MEAN, RSTD, C1, C2, DX, DWP, DBP, M, N, stride_x, stride_dy, stride_dx,
    HAS_WEIGHT: tl.constexpr, IS_LN: tl.constexpr, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
    ONE_TILE: tl.constexpr, BLOCK_M: tl.constexpr, SPAN: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr, ROUND_BF16: tl.constexpr, STAGES: tl.constexpr,
):
    """dx of rows [pid_m * BLOCK_M, +BLOCK_M) and columns [pid_n * BLOCK_N, +BLOCK_N), and those
    rows' float32 dw/db partial sums at row pid_m of DWP/DBP (N columns each). SPAN is BLOCK_M,
    or where M < BLOCK_M (one program) M rounded up to a power of two: the loop's trip count is a
    constant, which the interpreter needs, and rows past M only add zeros.

    One pass over x and dy: each [ROWS, BLOCK_N] tile gives its rows' dx and is added into
    [ROWS, BLOCK_N] float32 accumulators, summed over their rows once at the end (no cross-thread
    reduction per tile). Tiles ahead are in flight during a tile's arithmetic in one of two ways:
    STAGES = 0 loads the next tile into registers before this tile's arithmetic (one tile ahead,
    its registers held); STAGES >= 2 leaves it to Triton's software pipeliner (the loop's
    num_stages), which copies STAGES - 1 tiles ahead into shared memory with cp.async, so the
    bytes in flight do not cost registers. Same arithmetic in the same order either way."""
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    first = pid_m * BLOCK_M
    end = tl.minimum(first + SPAN, M)  # the last tile's prefetch stops at this program's rows
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        w = cols  # never read
    acc_dw = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    acc_db = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    if STAGES == 0:
        nxt = _load_tile(X, DY, MEAN, RSTD, C1, C2, first + tl.arange(0, ROWS), end, cols, cmask, stride_x,
                         stride_dy, IS_LN, ONE_TILE)
        for r0 in tl.range(0, SPAN, ROWS):
            rows = first + r0 + tl.arange(0, ROWS)
            cur = nxt
            nxt = _load_tile(X, DY, MEAN, RSTD, C1, C2, rows + ROWS, end, cols, cmask, stride_x, stride_dy,
                             IS_LN, ONE_TILE)  # the next tile, in flight during this one's arithmetic
            acc_dw, acc_db = _rows_step(cur, rows, end, cols, cmask, w, acc_dw, acc_db, DX, N, stride_dx,
                                        HAS_WEIGHT, IS_LN, HAS_DW, HAS_DB, ONE_TILE, ROUND_BF16)
    else:
        for r0 in tl.range(0, SPAN, ROWS, num_stages=STAGES):
            rows = first + r0 + tl.arange(0, ROWS)
            cur = _load_tile(X, DY, MEAN, RSTD, C1, C2, rows, end, cols, cmask, stride_x, stride_dy,
                             IS_LN, ONE_TILE)
            acc_dw, acc_db = _rows_step(cur, rows, end, cols, cmask, w, acc_dw, acc_db, DX, N, stride_dx,
                                        HAS_WEIGHT, IS_LN, HAS_DW, HAS_DB, ONE_TILE, ROUND_BF16)
    part = pid_m.to(tl.int64) * N + cols
    if HAS_DW:
        tl.store(DWP + part, tl.sum(acc_dw, axis=0), mask=cmask)
    if HAS_DB:
        tl.store(DBP + part, tl.sum(acc_db, axis=0), mask=cmask)


@triton.jit
def _rows_step(tile, rows, end, cols, cmask, w, acc_dw, acc_db, DX, N, stride_dx,
               HAS_WEIGHT: tl.constexpr, IS_LN: tl.constexpr, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
               ONE_TILE: tl.constexpr, ROUND_BF16: tl.constexpr):
    """One tile of bwd_rows: its rows' dx stored, the accumulators advanced."""
    x_raw, dy_raw, mean, rstd, c1, c2 = tile
    mask = (rows < end)[:, None] & cmask[None, :]
    x, dy = x_raw.to(tl.float32), dy_raw.to(tl.float32)
    if IS_LN:
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    else:
        xhat = tl.where(mask, x * rstd[:, None], 0.0)
    g = dy
    if HAS_WEIGHT:
        g = dy * w[None, :]
    if ONE_TILE:
        c1 = tl.sum(g * xhat, axis=1) / N
        c2 = tl.sum(g, axis=1) / N
    if IS_LN:
        dx = (g - c2[:, None] - xhat * c1[:, None]) * rstd[:, None]
    else:
        dx = (g - xhat * c1[:, None]) * rstd[:, None]
    _store_y(DX, rows.to(tl.int64)[:, None] * stride_dx + cols[None, :], dx, mask, ROUND_BF16)
    if HAS_DW:
        acc_dw += dy * xhat
    if HAS_DB:
        acc_db += dy
    return acc_dw, acc_db


@triton.jit
def _load_tile(X, DY, MEAN, RSTD, C1, C2, rows, end, cols, cmask, stride_x, stride_dy,
               IS_LN: tl.constexpr, ONE_TILE: tl.constexpr):
    """x and dy of a [ROWS, BLOCK_N] tile in their own dtype (zero past ``end`` and N) and the
    rows' mean, rstd (and, for long rows, c1 and c2; else rstd in their places, never read)."""
    rows64 = rows.to(tl.int64)
    rmask = rows < end
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    mean = rstd
    if IS_LN:
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
    c1 = rstd
    c2 = rstd
    if not ONE_TILE:
        c1 = tl.load(C1 + rows, mask=rmask, other=0.0)
        c2 = tl.load(C2 + rows, mask=rmask, other=0.0)
    return x, dy, mean, rstd, c1, c2


@triton.jit
def bwd_reduce(
    DWP, DBP, DW, DB, G, N, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr, PARTS: tl.constexpr,
    ITERS: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    """dw and db of BLOCK_N columns: the G partial rows summed in float32, PARTS at a time in a
    [PARTS, BLOCK_N] tile, in program order (a fixed tree for a given G, PARTS and BLOCK_N),
    rounded once. Narrow column blocks: many programs, each few loads of the (L2-resident)
    partials. ITERS (>= G / PARTS, a power of two: one compilation per bucket of M) is a constant
    loop bound, which the interpreter needs; steps past G add zeros, which leave the sums' bits
    as they are."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc_dw = tl.zeros([PARTS, BLOCK_N], dtype=tl.float32)
    acc_db = tl.zeros([PARTS, BLOCK_N], dtype=tl.float32)
    for it in tl.range(0, ITERS):
        parts = it * PARTS + tl.arange(0, PARTS)
        mask = (parts < G)[:, None] & cmask[None, :]
        offs = parts.to(tl.int64)[:, None] * N + cols[None, :]
        if HAS_DW:
            acc_dw += tl.load(DWP + offs, mask=mask, other=0.0)
        if HAS_DB:
            acc_db += tl.load(DBP + offs, mask=mask, other=0.0)
    if HAS_DW:
        _store_y(DW, cols, tl.sum(acc_dw, axis=0), cmask, ROUND_BF16)
    if HAS_DB:
        _store_y(DB, cols, tl.sum(acc_db, axis=0), cmask, ROUND_BF16)
