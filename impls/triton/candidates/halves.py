"""``layer_norm_split_lag_halves``: the lagged LayerNorm split (``_split_kernels.layer_norm_split_lag``,
the next row's load first) with a program's columns held as two halves, so that its store step,
the register peak (the previous row in float32, the weight and bias, the next row in flight),
holds half the weight and bias at a time: ptxas for sm_90 gave 96 registers against 128 at bf16
2048 columns x 2 warps, 128 against 164 in float32 (docs/perf-notes.md, item 54's open
question; within 3 points of triton.split, item 55). Same statistics and order of summation as
the registered kernel. tools/long_row_probe.py runs it as triton.split's lagged kernel
(candidates.store_halves).
"""
import triton
import triton.language as tl

from impls.triton._row_kernels import _store_y
from impls.triton._split_kernels import (_load_row, _merge_parts, _split_finish, _split_publish, _split_slot,
                                         _split_wait, layer_norm_split)  # noqa: F401 (rows the lag leaves out)


@triton.jit
def _store_half(Y, W, B, x_prev, cols, cmask, prev, stride_y, mean, rstd, HAS_WEIGHT: tl.constexpr,
                HAS_BIAS: tl.constexpr, W_EVICT: tl.constexpr, ROUND_BF16: tl.constexpr):
    """Row ``prev``'s y at ``cols``: its weight and bias loaded here, half a program's at a time."""
    y = (x_prev.to(tl.float32) - mean) * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=cmask, other=0.0, eviction_policy=W_EVICT).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=cmask, other=0.0, eviction_policy=W_EVICT).to(tl.float32)
    _store_y(Y, prev.to(tl.int64) * stride_y + cols, y, cmask, ROUND_BF16)


@triton.jit(do_not_specialize=["GROUPS"])
def layer_norm_split_lag_halves(
    X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr, HOLD_W: tl.constexpr = False, X_CACHE: tl.constexpr = "",
    W_EVICT: tl.constexpr = "", NEXT_FIRST: tl.constexpr = True,
):
    # The lagged kernels' launch choices, as SplitRowsKernel.run passes them: the next row is
    # always loaded first here, and the weight and bias are never held.
    tl.static_assert(not HOLD_W, "layer_norm_split_lag_halves loads its weight and bias each row")
    tl.static_assert(NEXT_FIRST, "layer_norm_split_lag_halves loads the next row first")
    H: tl.constexpr = BLOCK_N // 2
    group = tl.program_id(0) // SPLITS
    part = tl.program_id(0) % SPLITS
    ca = part * BLOCK_N + tl.arange(0, H)
    cb = ca + H
    ma = ca < N
    mb = cb < N
    n_part = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(tl.float32)
    j = tl.arange(0, SPLITS_P2)
    n_j = tl.minimum(tl.maximum(N - j * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    xa_cur = _load_row(X, group, stride_x, ca, ma, M, X_CACHE)
    xb_cur = _load_row(X, group, stride_x, cb, mb, M, X_CACHE)
    # Values of their own (see _split_kernels.layer_norm_split_lag: Triton 3.6 and x_prev).
    xa_prev = tl.zeros([H], dtype=X.dtype.element_ty)
    xb_prev = tl.zeros([H], dtype=X.dtype.element_ty)
    it = 0
    row = group
    while row < M + GROUPS:  # the last step (row >= M) only stores
        nxt = row + GROUPS
        xa_next = _load_row(X, nxt, stride_x, ca, ma, M, X_CACHE)
        xb_next = _load_row(X, nxt, stride_x, cb, mb, M, X_CACHE)
        xa = xa_cur.to(tl.float32)
        xb = xb_cur.to(tl.float32)
        m_part = tl.sum(xa + xb, axis=0) / n_part  # one block reduction over both halves
        da = tl.where(ma, xa - m_part, 0.0)
        db = tl.where(mb, xb - m_part, 0.0)
        m2_part = tl.sum(da * da + db * db, axis=0)
        if row < M:
            _split_publish(_split_slot(WORDS, group, it, 4, SPLITS), part, it, m_part, m2_part)
        if it > 0:
            m_j, m2_j = _split_wait(_split_slot(WORDS, group, it - 1, 4, SPLITS), it - 1, SPLITS, SPLITS_P2)
            mean, rstd = _merge_parts(m_j, m2_j, n_j, N, eps)
            prev = row - GROUPS
            _store_half(Y, W, B, xa_prev, ca, ma, prev, stride_y, mean, rstd, HAS_WEIGHT, HAS_BIAS, W_EVICT,
                        ROUND_BF16)
            _store_half(Y, W, B, xb_prev, cb, mb, prev, stride_y, mean, rstd, HAS_WEIGHT, HAS_BIAS, W_EVICT,
                        ROUND_BF16)
            if part == 0:
                tl.store(MEAN + prev, mean)
                tl.store(RSTD + prev, rstd)
        xa_prev = xa_cur
        xb_prev = xb_cur
        xa_cur = xa_next
        xb_cur = xb_next
        it += 1
        row += GROUPS
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2, 4)
