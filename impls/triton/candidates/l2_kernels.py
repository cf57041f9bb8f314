"""The lagged split kernels with an L2 bulk prefetch and without the next row held: the probe's
'L2 ahead' and 'L2 only' candidates (tools/long_row_probe.py; not measured yet,
docs/perf-notes.md, item 58). The same kernels as _split_kernels.rms_norm_split_lag and
layer_norm_split_lag (one body of their steps, _lagged_l2), under the same names (the launcher
finds them by name in this module, TritonKernel.kernel_module), with two compile-time choices
more:

- L2_AHEAD: rows this many steps past the next one brought into L2 by a bulk prefetch (0: none);
- HOLD_NEXT: the next row held in registers while this one is reduced (off: each step loads its
  own row, which L2_AHEAD brought into L2; two rows in registers instead of three).

At L2_AHEAD = 0 with HOLD_NEXT they are the registered kernels. rms_norm_split and
layer_norm_split (rows shorter than settings.SPLIT_LAG_MIN_N) are the registered ones.
"""
import triton
import triton.language as tl

from impls.triton._split_kernels import (_held_columns, _ln_lag_step, _load_row, _part_counts,  # noqa: F401
                                         _part_moments, _rms_lag_step, _split_finish, _split_program,
                                         layer_norm_split, rms_norm_split)

# Rows ahead of the next one brought into L2 by a bulk prefetch (L2_AHEAD):
# one thread of the program issues cp.async.bulk.prefetch.L2 (sm_90) for the program's columns of
# that row, so HBM reads are in flight that hold no registers, and the row's later load into
# registers (x_next) hits L2. Only the 16-byte-aligned span inside the columns is prefetched (the
# instruction needs 16-byte addresses and sizes; strided rows need not be aligned). A hint: it
# changes no value. With HOLD_NEXT off no row is held ahead in registers:
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
    _lagged_l2(X, W, W, Y, RSTD, RSTD, WORDS, DONE, M, N, stride_x, stride_y, eps, GROUPS, HAS_WEIGHT, False,
               BLOCK_N, SPLITS, SPLITS_P2, ROUND_BF16, HOLD_W, X_CACHE, W_EVICT, NEXT_FIRST, L2_AHEAD, HOLD_NEXT,
               False)


@triton.jit(do_not_specialize=["GROUPS"])
def layer_norm_split_lag(
    X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr, HOLD_W: tl.constexpr = False, X_CACHE: tl.constexpr = "",
    W_EVICT: tl.constexpr = "", NEXT_FIRST: tl.constexpr = False, L2_AHEAD: tl.constexpr = 0,
    HOLD_NEXT: tl.constexpr = True,
):
    _lagged_l2(X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N, stride_x, stride_y, eps, GROUPS, HAS_WEIGHT, HAS_BIAS,
               BLOCK_N, SPLITS, SPLITS_P2, ROUND_BF16, HOLD_W, X_CACHE, W_EVICT, NEXT_FIRST, L2_AHEAD, HOLD_NEXT,
               True)


@triton.jit
def _lagged_l2(X, W, B, Y, MEAN, RSTD, WORDS, DONE, M, N: tl.constexpr, stride_x, stride_y, eps, GROUPS,
               HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
               SPLITS_P2: tl.constexpr, ROUND_BF16: tl.constexpr, HOLD_W: tl.constexpr, X_CACHE: tl.constexpr,
               W_EVICT: tl.constexpr, NEXT_FIRST: tl.constexpr, L2_AHEAD: tl.constexpr, HOLD_NEXT: tl.constexpr,
               LAYER_NORM: tl.constexpr):
    """Both kernels' body: the registered lagged kernel's steps (RMSNorm's, or LayerNorm's where
    LAYER_NORM; RMSNorm's B and MEAN are never read) with L2_AHEAD and HOLD_NEXT."""
    group, part, cols, cmask = _split_program(N, BLOCK_N, SPLITS)
    if LAYER_NORM:
        n_part, n_j = _part_counts(part, N, BLOCK_N, SPLITS_P2)
    if HOLD_NEXT:
        x_cur = tl.load(X + group.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0,
                        cache_modifier=X_CACHE)  # group < M
    else:  # each step loads its own row
        x_cur = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)
    w_held = _held_columns(W, cols, cmask, HOLD_W and HAS_WEIGHT)
    if LAYER_NORM:
        b_held = _held_columns(B, cols, cmask, HOLD_W and HAS_BIAS)
    x_prev = tl.zeros([BLOCK_N], dtype=X.dtype.element_ty)  # see _split_kernels.rms_norm_split_lag
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
        if LAYER_NORM:
            m_part, _, m2_part = _part_moments(x_cur.to(tl.float32), cmask, n_part)
        else:
            x = x_cur.to(tl.float32)
            ss = tl.sum(x * x, axis=0)
        if HOLD_NEXT and not NEXT_FIRST:
            x_next = _load_row(X, nxt, stride_x, cols, cmask, M, X_CACHE)
        if LAYER_NORM:
            _ln_lag_step(WORDS, W, B, Y, MEAN, RSTD, m_part, m2_part, n_j, x_prev, w_held, b_held, group, part, it,
                         row, cols, cmask, M, N, GROUPS, stride_y, eps, HAS_WEIGHT, HAS_BIAS, HOLD_W, W_EVICT, SPLITS,
                         SPLITS_P2, ROUND_BF16)
        else:
            _rms_lag_step(WORDS, W, Y, RSTD, ss, x_prev, w_held, group, part, it, row, cols, cmask, M, N, GROUPS,
                          stride_y, eps, HAS_WEIGHT, HOLD_W, W_EVICT, SPLITS, SPLITS_P2, ROUND_BF16)
        x_prev = x_cur
        if HOLD_NEXT:
            x_cur = x_next
        it += 1
        row += GROUPS
    _split_finish(WORDS, DONE, group, SPLITS, SPLITS_P2, 4)
