"""The Triton kernels. Imported only through _launch.state(), once triton is known to import.

Every kernel works on a [ROWS, BLOCK_N] tile: ROWS rows of one program, BLOCK_N columns.
Loads are masked (rows >= M, columns >= N) with 0 as the fill, and every sum over columns
sees 0 in padded lanes, so statistics divide by N, never by the padded width. Accumulation
and statistics are float32; y is stored in x's dtype. Row offsets are 64-bit.

The rowwise kernels have a 1-D form for one row per program (rms_norm_row, layer_norm_row).
The looped, split and LayerNorm rowwise kernels take N as a compile-time constant (one
compilation per N, as the TileLang kernels have it): the chunk count is then known, which
measured much faster (docs/perf-notes.md, item 15). It also gives the interpreter a Python int
loop bound, which it needs. The rowwise LayerNorm measured slightly faster with a static N
(item 21); the rowwise RMSNorm did not, and keeps N a runtime value.
"""
import triton
import triton.language as tl


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
def _row_offsets(pid, M, stride_x, stride_y, ROWS: tl.constexpr):
    rows = pid * ROWS + tl.arange(0, ROWS)
    rows64 = rows.to(tl.int64)  # before the multiply: M * stride may pass 2**31
    return rows, rows < M, rows64 * stride_x, rows64 * stride_y


# -- RMSNorm ------------------------------------------------------------------------------------
@triton.jit
def rms_norm_rowwise(
    X, W, Y, RSTD, M, N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, W_FIRST: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
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
):
    """rms_norm_rowwise at one row per program (the grid is M): 1-D, the row's offset a scalar and
    no row mask, the same arithmetic. The launcher runs it at decode sizes and where its register
    count gives more blocks per SM than the tile's (docs/perf-notes.md, items 26 and 31)."""
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
    W_FIRST: tl.constexpr, ROUND_BF16: tl.constexpr,
):
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
    ROUND_BF16: tl.constexpr,
):
    """layer_norm_rowwise at one row per program (see rms_norm_row)."""
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


# -- Split rows ---------------------------------------------------------------------------------
# A long row split over SPLITS programs, each holding BLOCK_N of its columns in registers, so x
# is read from memory once (the looped kernels read it twice, the second time from L2 only while
# the rows in flight fit). The programs of a row exchange partial statistics through global
# memory and wait for each other, so they must all be resident at once: the grid is persistent,
# GROUPS groups of SPLITS programs sized by the launcher to what the GPU holds, each group
# taking rows GROUP, GROUP + GROUPS, ... in step. (Should another kernel hold some SMs, the
# groups dispatched first still complete and free theirs, as long as programs are dispatched
# in order of program id, which is what the hardware is observed to do; a group's programs
# have consecutive ids.) The interpreter runs programs one at a time and cannot run these
# kernels.
#
# Each partial is published as one 64-bit word, (row tag << 32) | float bits, so a reader that
# sees the tag sees the value: no fence, which would make the writer wait for its earlier y
# stores to land. A group's words sit in two row slots (WORDS[group, it % 2, part, pair]): a
# program can be one row ahead of a sibling still reading, never two (it cannot pass the next
# wait without that sibling). While a program waits, its next row's x is already loading (with
# DEPTH = 2 its next two rows': twice the loads in flight, for twice x's registers).
# DONE counts programs past their last wait; the group's last one zeroes its words, so every
# launch starts from tags of 0 (the workspace is zero when made).
@triton.jit
def _split_slot(WORDS, group, it, SLOTS: tl.constexpr, SPLITS: tl.constexpr):
    """Row ``it``'s slot of its group's words: SLOTS row slots of SPLITS pairs per group."""
    return WORDS + (group * SLOTS + it % SLOTS) * SPLITS * 2


@triton.jit
def _split_publish(slot, part, it, a, b):
    """This program's pair (a, b) for row ``it``, each word tagged with it + 1."""
    tag = (it + 1).to(tl.int64) << 32
    tl.atomic_xchg(slot + part * 2, tag | a.to(tl.uint32, bitcast=True).to(tl.int64), sem="relaxed", scope="gpu")
    tl.atomic_xchg(slot + part * 2 + 1, tag | b.to(tl.uint32, bitcast=True).to(tl.int64), sem="relaxed", scope="gpu")


@triton.jit
def _split_wait(slot, it, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
    """Wait until every sibling's pair for row ``it`` is in its slot; return all SPLITS pairs
    (padded to SPLITS_P2 with zeros), in part order."""
    tag = (it + 1).to(tl.int64) << 32
    j = tl.arange(0, SPLITS_P2)
    wa = tl.load(slot + j * 2, mask=j < SPLITS, other=tag, volatile=True)
    wb = tl.load(slot + j * 2 + 1, mask=j < SPLITS, other=tag, volatile=True)
    while tl.sum(((wa >> 32) != (it + 1)).to(tl.int32) + ((wb >> 32) != (it + 1)).to(tl.int32), axis=0) > 0:
        wa = tl.load(slot + j * 2, mask=j < SPLITS, other=tag, volatile=True)
        wb = tl.load(slot + j * 2 + 1, mask=j < SPLITS, other=tag, volatile=True)
    pa = (wa & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    pb = (wb & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    return tl.where(j < SPLITS, pa, 0.0), tl.where(j < SPLITS, pb, 0.0)


@triton.jit
def _split_exchange(WORDS, group, part, it, a, b, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
    """Publish this program's pair (a, b) for row ``it`` of its group, wait for every sibling's,
    and return all SPLITS pairs (padded to SPLITS_P2 with zeros), in part order."""
    slot = _split_slot(WORDS, group, it, 2, SPLITS)
    _split_publish(slot, part, it, a, b)
    return _split_wait(slot, it, SPLITS, SPLITS_P2)


@triton.jit
def _row_cols(cmask, row, M):
    """The load mask of this program's columns of row ``row``: cmask inside the rows, none past
    the last. The row is compared column by column, not as one scalar and'ed in: Triton 3.9's
    interpreter broadcasts a scalar comparison as int32 and its tl.load refuses an int32 mask
    (3.6's took it). Compiled, the same instructions as cmask & (row < M)."""
    return cmask & (row + tl.zeros(cmask.shape, tl.int32) < M)


@triton.jit
def _split_finish(WORDS, DONE, group, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, SLOTS: tl.constexpr = 2):
    """Called by every program after its last wait: the group's last one zeroes its words."""
    done = tl.atomic_add(DONE + group, 1, sem="acq_rel", scope="gpu")
    if done == SPLITS - 1:
        j = tl.arange(0, 2 * SLOTS * SPLITS_P2)
        tl.store(WORDS + group * 2 * SLOTS * SPLITS + j, tl.zeros([2 * SLOTS * SPLITS_P2], dtype=tl.int64),
                 mask=j < 2 * SLOTS * SPLITS)
        tl.atomic_xchg(DONE + group, 0, sem="release", scope="gpu")


@triton.jit
def _merge_parts(m_j, m2_j, n_j, N: tl.constexpr, eps):
    """The row's mean and rstd from its parts' means m_j, centred sums of squares m2_j and
    column counts n_j, by Chan's combination, in part order (the same in every program)."""
    mean = tl.sum(n_j * m_j, axis=0) / N
    dm = m_j - mean
    var = (tl.sum(m2_j, axis=0) + tl.sum(n_j * dm * dm, axis=0)) / N
    return mean, tl.rsqrt(var + eps)


@triton.jit(do_not_specialize=["GROUPS"])
def rms_norm_split(
    X, W, Y, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    ROUND_BF16: tl.constexpr, DEPTH: tl.constexpr = 1,
):
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    x_next = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, group, M), other=0.0)
    if DEPTH == 2:
        x_next2 = tl.load(X + (group + GROUPS).to(tl.int64) * stride_x + cols,
                          mask=_row_cols(cmask, group + GROUPS, M), other=0.0)
    it = 0
    for row in tl.range(group, M, GROUPS):
        row64 = row.to(tl.int64)
        x = x_next.to(tl.float32)
        ss = tl.sum(x * x, axis=0)
        nxt = row + DEPTH * GROUPS
        if DEPTH == 2:
            x_next = x_next2
            x_next2 = tl.load(X + nxt.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, nxt, M), other=0.0)
        else:
            x_next = tl.load(X + nxt.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, nxt, M), other=0.0)
        ss_j, _ = _split_exchange(WORDS, group, part, it, ss, ss, SPLITS, SPLITS_P2)
        rstd = tl.rsqrt(tl.sum(ss_j, axis=0) / N + eps)  # the same order in every program
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        _store_y(Y, row64 * stride_y + cols, y, cmask, ROUND_BF16)
        if part == 0:
            tl.store(RSTD + row, rstd)
        it += 1
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2)


@triton.jit(do_not_specialize=["GROUPS"])
def layer_norm_split(
    X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr, DEPTH: tl.constexpr = 1,
):
    # Each program reduces its own columns exactly (two passes over registers: mean, then the
    # centred sum of squares), and the row's mean and variance come from the parts' (mean, M2)
    # by Chan's combination: no large common part cancels, large-mean rows included.
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    n_part = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(tl.float32)
    j = tl.arange(0, SPLITS_P2)
    n_j = tl.minimum(tl.maximum(N - j * BLOCK_N, 0), BLOCK_N).to(tl.float32)  # columns per part
    x_next = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, group, M), other=0.0)
    if DEPTH == 2:
        x_next2 = tl.load(X + (group + GROUPS).to(tl.int64) * stride_x + cols,
                          mask=_row_cols(cmask, group + GROUPS, M), other=0.0)
    it = 0
    for row in tl.range(group, M, GROUPS):
        row64 = row.to(tl.int64)
        x = x_next.to(tl.float32)
        m_part = tl.sum(x, axis=0) / n_part
        d = tl.where(cmask, x - m_part, 0.0)
        m2_part = tl.sum(d * d, axis=0)
        nxt = row + DEPTH * GROUPS
        if DEPTH == 2:
            x_next = x_next2
            x_next2 = tl.load(X + nxt.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, nxt, M), other=0.0)
        else:
            x_next = tl.load(X + nxt.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, nxt, M), other=0.0)
        m_j, m2_j = _split_exchange(WORDS, group, part, it, m_part, m2_part, SPLITS, SPLITS_P2)
        mean, rstd = _merge_parts(m_j, m2_j, n_j, N, eps)
        y = (d + (m_part - mean)) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        _store_y(Y, row64 * stride_y + cols, y, cmask, ROUND_BF16)
        if part == 0:
            tl.store(MEAN + row, mean)
            tl.store(RSTD + row, rstd)
        it += 1
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2)


# The lagged split kernels (rows longer than SPLIT_LAG_MIN_N): the exchange off the critical
# path. rms_norm_split waits for every sibling's partial of row i before it stores row i, so
# each row costs a load plus a wait for the slowest of SPLITS programs (latency-bound: 51-82%
# of copy at N 65536-262144, docs/perf-notes.md item 44). Here iteration i publishes row i's partial, then
# waits for row i - 1's (published by the siblings one iteration ago: normally there already)
# and stores row i - 1, whose x it still holds; the load of row i + 1 is in flight meanwhile.
# One epilogue iteration stores each group's last row. A fast program may publish row k while
# a slow sibling still reads row k - 3 (it waited for row k - 2 to be published, no more), so
# the workspace has 4 row slots per group (_split.SPLIT_WORDS), against rms_norm_split's 2. Summation order as
# rms_norm_split's: deterministic and batch invariant.


@triton.jit
def _load_row(X, row, stride_x, cols, cmask, M, X_CACHE: tl.constexpr):
    """This program's columns of row ``row`` of x (zeros past the last row), loaded with X_CACHE."""
    return tl.load(X + row.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, row, M), other=0.0,
                   cache_modifier=X_CACHE)


@triton.jit
def _held_columns(P, cols, cmask, HOLD: tl.constexpr):
    """A program's columns of the weight (or bias) P, loaded once before its row loop when HOLD
    (a program's columns never change), else zeros that nothing reads."""
    if HOLD:
        return tl.load(P + cols, mask=cmask, other=0.0)
    return tl.zeros(cols.shape, dtype=P.dtype.element_ty)


@triton.jit
def _columns(P, cols, cmask, held, HOLD: tl.constexpr, W_EVICT: tl.constexpr):
    """The weight (or bias) columns in float32 for this row: the held ones, or loaded now (with
    the L1 eviction hint W_EVICT: every row of the program reads the same columns again)."""
    if HOLD:
        return held.to(tl.float32)
    return tl.load(P + cols, mask=cmask, other=0.0, eviction_policy=W_EVICT).to(tl.float32)


# Rows ahead of the next one brought into L2 by a bulk prefetch (settings.LaunchConfig.l2_ahead):
# one thread of the program issues cp.async.bulk.prefetch.L2 (sm_90) for the program's columns of
# that row, so HBM reads are in flight that hold no registers, and the row's later load into
# registers (x_next) hits L2. Only the 16-byte-aligned span inside the columns is prefetched (the
# instruction needs 16-byte addresses and sizes; strided rows need not be aligned). A hint: it
# changes no value. With HOLD_NEXT off (LaunchConfig.hold_next) no row is held ahead in registers:
# each step loads its own row, from L2 where the prefetch brought it, so two rows are live instead
# of three. The interpreter has no inline PTX (it runs these kernels only at L2_AHEAD = 0, one
# program a row: the tests).
_L2_PREFETCH_PTX = tl.constexpr("""{
 .reg .pred p, q;
 .reg .u32 t, n;
 .reg .u64 a, e, s;
 mov.u32 t, %tid.x;
 add.u64 a, $1, 15;
 and.b64 a, a, 0xFFFFFFFFFFFFFFF0;
 cvt.u64.u32 s, $2;
 add.u64 e, $1, s;
 and.b64 e, e, 0xFFFFFFFFFFFFFFF0;
 setp.gt.u64 q, e, a;
 setp.eq.and.u32 p, t, 0, q;
 sub.u64 s, e, a;
 cvt.u32.u64 n, s;
 @p cp.async.bulk.prefetch.L2.global [a], n;
 mov.u32 $0, 0;
}""")


@triton.jit
def _prefetch_row_l2(X, row, stride_x, part, N: tl.constexpr, BLOCK_N: tl.constexpr, M):
    """Bring program ``part``'s columns of row ``row`` of x into L2 (nothing past the last row),
    issued by the program's first thread."""
    if row < M:
        nbytes = tl.minimum(N - part * BLOCK_N, BLOCK_N) * (X.dtype.element_ty.primitive_bitwidth // 8)
        tl.inline_asm_elementwise(_L2_PREFETCH_PTX, "=r,l,r", [X + row.to(tl.int64) * stride_x + part * BLOCK_N, nbytes],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit(do_not_specialize=["GROUPS"])
def rms_norm_split_lag(
    X, W, Y, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    ROUND_BF16: tl.constexpr, HOLD_W: tl.constexpr = False, X_CACHE: tl.constexpr = "", W_EVICT: tl.constexpr = "",
    NEXT_FIRST: tl.constexpr = False, L2_AHEAD: tl.constexpr = 0, HOLD_NEXT: tl.constexpr = True,
):
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HOLD_NEXT:
        x_cur = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0,
                        cache_modifier=X_CACHE)  # group < M
    else:  # each step loads its own row
        x_cur = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    w_held = _held_columns(W, cols, cmask, HOLD_W and HAS_WEIGHT)
    # A value of its own: initialised as x_cur, Triton 3.6 drops x_prev from the loop's carried
    # values and reads x_cur in its place (bad rows: all but each group's first).
    x_prev = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    FIRST_AHEAD: tl.constexpr = 1 if HOLD_NEXT else 0  # the rows the steps prefetch for start after these
    for ahead in tl.static_range(FIRST_AHEAD, L2_AHEAD):
        _prefetch_row_l2(X, group + (1 + ahead) * GROUPS, stride_x, part, N, BLOCK_N, M)
    it = 0
    row = group
    while row < M + GROUPS:  # the last step (row >= M) only stores (a while loop: the interpreter)
        nxt = row + GROUPS
        if L2_AHEAD > 0:  # row i + 1 + L2_AHEAD into L2, for its load L2_AHEAD steps from now
            _prefetch_row_l2(X, nxt + L2_AHEAD * GROUPS, stride_x, part, N, BLOCK_N, M)
        if not HOLD_NEXT:  # this row, from L2 where L2_AHEAD brought it
            x_cur = _load_row(X, row, stride_x, cols, cmask, M, X_CACHE)
        elif NEXT_FIRST:  # row i + 1's load in flight across row i's reductions
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        x = x_cur.to(tl.float32)
        ss = tl.sum(x * x, axis=0)
        if HOLD_NEXT and not NEXT_FIRST:
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        if row < M:
            _split_publish(_split_slot(WORDS, group, it, 4, SPLITS), part, it, ss, ss)
        if it > 0:
            ss_j, ss_k = _split_wait(_split_slot(WORDS, group, it - 1, 4, SPLITS), it - 1, SPLITS, SPLITS_P2)
            # Both words hold ss; reading both (the max of equal values) keeps Triton 3.6 from a
            # layout pass that fails on the unused one (2048 columns x 4 warps at 128 programs a row).
            rstd = tl.rsqrt(tl.sum(tl.maximum(ss_j, ss_k), axis=0) / N + eps)  # the same order in every program
            y = x_prev.to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * _columns(W, cols, cmask, w_held, HOLD_W, W_EVICT)
            prev = row - GROUPS
            _store_y(Y, prev.to(tl.int64) * stride_y + cols, y, cmask, ROUND_BF16)
            if part == 0:
                tl.store(RSTD + prev, rstd)
        x_prev = x_cur
        if HOLD_NEXT:
            x_cur = x_next
        it += 1
        row += GROUPS
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2, 4)


@triton.jit(do_not_specialize=["GROUPS"])
def layer_norm_split_lag(
    X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr, HOLD_W: tl.constexpr = False, X_CACHE: tl.constexpr = "",
    W_EVICT: tl.constexpr = "", NEXT_FIRST: tl.constexpr = False, L2_AHEAD: tl.constexpr = 0,
    HOLD_NEXT: tl.constexpr = True,
):
    # triton.split's statistics (each part's exact mean and centred M2, merged by Chan's
    # combination), lagged as rms_norm_split_lag.
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    n_part = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(tl.float32)
    j = tl.arange(0, SPLITS_P2)
    n_j = tl.minimum(tl.maximum(N - j * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    if HOLD_NEXT:
        x_cur = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0, cache_modifier=X_CACHE)
    else:  # each step loads its own row
        x_cur = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    w_held = _held_columns(W, cols, cmask, HOLD_W and HAS_WEIGHT)
    b_held = _held_columns(B, cols, cmask, HOLD_W and HAS_BIAS)
    # A value of its own: initialised as x_cur, Triton 3.6 drops x_prev from the loop's carried
    # values and reads x_cur in its place (bad rows: all but each group's first).
    x_prev = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    FIRST_AHEAD: tl.constexpr = 1 if HOLD_NEXT else 0  # the rows the steps prefetch for start after these
    for ahead in tl.static_range(FIRST_AHEAD, L2_AHEAD):
        _prefetch_row_l2(X, group + (1 + ahead) * GROUPS, stride_x, part, N, BLOCK_N, M)
    it = 0
    row = group
    while row < M + GROUPS:  # the last step (row >= M) only stores (a while loop: the interpreter)
        nxt = row + GROUPS
        if L2_AHEAD > 0:  # row i + 1 + L2_AHEAD into L2, for its load L2_AHEAD steps from now
            _prefetch_row_l2(X, nxt + L2_AHEAD * GROUPS, stride_x, part, N, BLOCK_N, M)
        if not HOLD_NEXT:  # this row, from L2 where L2_AHEAD brought it
            x_cur = _load_row(X, row, stride_x, cols, cmask, M, X_CACHE)
        elif NEXT_FIRST:  # row i + 1's load in flight across row i's reductions
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        x = x_cur.to(tl.float32)
        m_part = tl.sum(x, axis=0) / n_part
        d = tl.where(cmask, x - m_part, 0.0)
        m2_part = tl.sum(d * d, axis=0)
        if HOLD_NEXT and not NEXT_FIRST:
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        if row < M:
            _split_publish(_split_slot(WORDS, group, it, 4, SPLITS), part, it, m_part, m2_part)
        if it > 0:
            m_j, m2_j = _split_wait(_split_slot(WORDS, group, it - 1, 4, SPLITS), it - 1, SPLITS, SPLITS_P2)
            mean, rstd = _merge_parts(m_j, m2_j, n_j, N, eps)
            y = (x_prev.to(tl.float32) - mean) * rstd
            if HAS_WEIGHT:
                y = y * _columns(W, cols, cmask, w_held, HOLD_W, W_EVICT)
            if HAS_BIAS:
                y = y + _columns(B, cols, cmask, b_held, HOLD_W, W_EVICT)
            prev = row - GROUPS
            _store_y(Y, prev.to(tl.int64) * stride_y + cols, y, cmask, ROUND_BF16)
            if part == 0:
                tl.store(MEAN + prev, mean)
                tl.store(RSTD + prev, rstd)
        x_prev = x_cur
        if HOLD_NEXT:
            x_cur = x_next
        it += 1
        row += GROUPS
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2, 4)
