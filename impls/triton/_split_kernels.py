"""The Triton kernels that run a row over several programs (the split variant): rms_norm_split and
layer_norm_split, and the lagged forms of rows of at least settings.SPLIT_LAG_MIN_N columns. They
take N as a compile-time constant, as the looped kernels do (_row_kernels). Imported through
_kernels, once triton is known to import.
"""
import triton
import triton.language as tl

from impls.triton._row_kernels import _store_y


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
# wait without that sibling). While a program waits, its next row's x is already loading (two
# rows ahead measured slower: docs/perf-notes.md, item 37).
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


@triton.jit
def _split_program(N: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    """This program's group, its part of the group's rows, and the part's columns with their mask."""
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    return group, part, cols, cols < N


@triton.jit
def _part_counts(part, N: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS_P2: tl.constexpr):
    """The columns of part ``part`` and of each of the SPLITS_P2 parts (none past the last), in
    float32: the weights of their statistics."""
    n_part = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(tl.float32)
    j = tl.arange(0, SPLITS_P2)
    return n_part, tl.minimum(tl.maximum(N - j * BLOCK_N, 0), BLOCK_N).to(tl.float32)


@triton.jit
def _part_moments(x, cmask, n_part):
    """A part's exact statistics of float32 x: its mean, x less it (0 in padded lanes), and the
    centred sum of squares M2."""
    m_part = tl.sum(x, axis=0) / n_part
    d = tl.where(cmask, x - m_part, 0.0)
    return m_part, d, tl.sum(d * d, axis=0)


@triton.jit(do_not_specialize=["GROUPS"])
def rms_norm_split(
    X, W, Y, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    group, part, cols, cmask = _split_program(N, BLOCK_N, SPLITS)
    x_next = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, group, M), other=0.0)
    it = 0
    for row in tl.range(group, M, GROUPS):
        row64 = row.to(tl.int64)
        x = x_next.to(tl.float32)
        ss = tl.sum(x * x, axis=0)
        nxt = row + GROUPS
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
    SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    # Each program reduces its own columns exactly (two passes over registers: mean, then the
    # centred sum of squares), and the row's mean and variance come from the parts' (mean, M2)
    # by Chan's combination: no large common part cancels, large-mean rows included.
    group, part, cols, cmask = _split_program(N, BLOCK_N, SPLITS)
    n_part, n_j = _part_counts(part, N, BLOCK_N, SPLITS_P2)
    x_next = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=_row_cols(cmask, group, M), other=0.0)
    it = 0
    for row in tl.range(group, M, GROUPS):
        row64 = row.to(tl.int64)
        m_part, d, m2_part = _part_moments(x_next.to(tl.float32), cmask, n_part)
        nxt = row + GROUPS
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


@triton.jit
def _rms_lag_step(WORDS, W, Y, RSTD, ss, x_prev, w_held, group, part, it, row, cols, cmask, M, N: tl.constexpr,
                  GROUPS, stride_y, eps, HAS_WEIGHT: tl.constexpr, HOLD_W: tl.constexpr, W_EVICT: tl.constexpr,
                  SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr):
    """Iteration ``it`` of a lagged RMSNorm program once row ``row`` is reduced: the row's partial
    ss published (none past the last row), then the previous row (x_prev) stored once every
    sibling's partial of it is in (none before the first)."""
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


@triton.jit
def _ln_lag_step(WORDS, W, B, Y, MEAN, RSTD, m_part, m2_part, n_j, x_prev, w_held, b_held, group, part, it, row,
                 cols, cmask, M, N: tl.constexpr, GROUPS, stride_y, eps, HAS_WEIGHT: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HOLD_W: tl.constexpr, W_EVICT: tl.constexpr, SPLITS: tl.constexpr,
                 SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr):
    """_rms_lag_step for LayerNorm: the partials are the part's mean and M2, merged by
    _merge_parts."""
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


@triton.jit(do_not_specialize=["GROUPS"])
def rms_norm_split_lag(
    X, W, Y, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    ROUND_BF16: tl.constexpr, HOLD_W: tl.constexpr = False, X_CACHE: tl.constexpr = "", W_EVICT: tl.constexpr = "",
    NEXT_FIRST: tl.constexpr = False,
):
    group, part, cols, cmask = _split_program(N, BLOCK_N, SPLITS)
    x_cur = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0,
                    cache_modifier=X_CACHE)  # group < M
    w_held = _held_columns(W, cols, cmask, HOLD_W and HAS_WEIGHT)
    # A value of its own: initialised as x_cur, Triton 3.6 drops x_prev from the loop's carried
    # values and reads x_cur in its place (bad rows: all but each group's first).
    x_prev = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    it = 0
    row = group
    while row < M + GROUPS:  # the last step (row >= M) only stores (a while loop: the interpreter)
        nxt = row + GROUPS
        if NEXT_FIRST:  # row i + 1's load in flight across row i's reductions
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        x = x_cur.to(tl.float32)
        ss = tl.sum(x * x, axis=0)
        if not NEXT_FIRST:
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        _rms_lag_step(WORDS, W, Y, RSTD, ss, x_prev, w_held, group, part, it, row, cols, cmask, M, N, GROUPS,
                      stride_y, eps, HAS_WEIGHT, HOLD_W, W_EVICT, SPLITS, SPLITS_P2, ROUND_BF16)
        x_prev = x_cur
        x_cur = x_next
        it += 1
        row += GROUPS
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2, 4)


@triton.jit(do_not_specialize=["GROUPS"])
def layer_norm_split_lag(
    X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr, HOLD_W: tl.constexpr = False, X_CACHE: tl.constexpr = "",
    W_EVICT: tl.constexpr = "", NEXT_FIRST: tl.constexpr = False,
):
    # triton.split's statistics (each part's exact mean and centred M2, merged by Chan's
    # combination), lagged as rms_norm_split_lag.
    group, part, cols, cmask = _split_program(N, BLOCK_N, SPLITS)
    n_part, n_j = _part_counts(part, N, BLOCK_N, SPLITS_P2)
    x_cur = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0, cache_modifier=X_CACHE)
    w_held = _held_columns(W, cols, cmask, HOLD_W and HAS_WEIGHT)
    b_held = _held_columns(B, cols, cmask, HOLD_W and HAS_BIAS)
    # A value of its own (see rms_norm_split_lag).
    x_prev = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    it = 0
    row = group
    while row < M + GROUPS:  # the last step (row >= M) only stores
        nxt = row + GROUPS
        if NEXT_FIRST:  # row i + 1's load in flight across row i's reductions
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        m_part, _, m2_part = _part_moments(x_cur.to(tl.float32), cmask, n_part)
        if not NEXT_FIRST:
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        _ln_lag_step(WORDS, W, B, Y, MEAN, RSTD, m_part, m2_part, n_j, x_prev, w_held, b_held, group, part, it, row,
                     cols, cmask, M, N, GROUPS, stride_y, eps, HAS_WEIGHT, HAS_BIAS, HOLD_W, W_EVICT, SPLITS,
                     SPLITS_P2, ROUND_BF16)
        x_prev = x_cur
        x_cur = x_next
        it += 1
        row += GROUPS
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2, 4)
