"""The cluster candidates' programs: impls/tilelang/_long_programs' kernels with the choices of
plans.CandidatePlan (not measured yet: docs/perf-notes.md, item 58). Each block's segment of the
rows a wave ahead brought into L2 (l2_ahead), the first chunks' weight and bias loaded ahead of
the wait for the peers (wb_ahead), and LayerNorm's rows normalised in turn by one cluster
(seq_rows). At zero each builds the registered kernel's program.
"""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T
import torch

from impls.tilelang._cluster_parts import (_chunk_loop, _helpers, _lane_statistics, _merge_partials, _row_of,
                                           _rows_layout, _smem_chunks)
from impls.tilelang._long_plan import cluster_size
from impls.tilelang._long_programs import (_layer_norm_program, _ln_exchange, _store_rows, layer_norm_cluster,
                                            rms_norm_cluster)
from impls.tilelang._program_parts import F32, _affine, _signature_sizes
from impls.tilelang.plan import Plan

# CandidatePlan.l2_ahead: thread 0 brings the 16-byte-aligned span of ``bytes`` bytes at
# ``col_bytes`` into row ``row`` of x into L2 (cp.async.bulk.prefetch, sm_90; no registers, no shared memory); nothing
# past row m - 1. A hint: no value changes. normdiff_sm_count: the SMs (%nsmid, which may count a
# few more than the GPU has), from which the cluster kernels reckon a wave of rows.
_PREFETCH_SOURCE = r"""
__device__ __forceinline__ int normdiff_sm_count() {
  unsigned sms;
  asm volatile("mov.u32 %0, %%nsmid;" : "=r"(sms));
  return (int)sms;
}
__device__ __forceinline__ void normdiff_prefetch_l2(const void* x, long long row, long long m, long long row_bytes,
                                                     long long col_bytes, unsigned bytes) {
  if (threadIdx.x != 0 || row >= m) return;
  unsigned long long a = (unsigned long long)x + row * row_bytes + col_bytes;
  unsigned long long e = (a + bytes) & ~15ull;
  a = (a + 15) & ~15ull;
  if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(a), "r"((unsigned)(e - a)) : "memory");
}
"""


def _prefetch_row(plan: Plan):
    """A macro: the block's segment (columns from ``base``) of row ``row`` into L2
    (normdiff_prefetch_l2)."""
    size = getattr(torch, plan.dtype).itemsize

    @T.macro
    def prefetch(X, row, base, sxv, M):
        T.call_extern("handle", "normdiff_prefetch_l2", X.data, T.cast(row, "int64"), T.cast(M, "int64"),
                      sxv * (plan.vec * size), T.cast(base, "int64") * size,
                      T.cast(T.max(T.min(plan.padded, plan.n - base), 0) * size, "uint32"))
    return prefetch


def _prefetch_ahead(plan: Plan, C: int):
    """A macro: with CandidatePlan.l2_ahead, the block's segment of each of its rows l2_ahead waves ahead
    into L2 (a wave: SMs x blocks an SM / C blocks a cluster x rows a block); nothing otherwise."""
    per_sm = plan.l2_ahead * (plan.min_blocks or 1) * plan.rows_per_block
    prefetch_row = _prefetch_row(plan)

    @T.macro
    def prefetch(X, row, base, sxv, M):
        if plan.l2_ahead:
            for r in T.unroll(plan.rows_per_block):
                prefetch_row(X, row + r + T.call_extern("int32", "normdiff_sm_count") * per_sm // C, base, sxv, M)
    return prefetch


def _more(plan: Plan) -> tuple:
    """The device functions the candidate programs call beside the kernel's own (_helpers)."""
    return (_PREFETCH_SOURCE,) if plan.l2_ahead else ()


def rms_norm_cluster_ahead(plan: Plan):
    """_long_programs.rms_norm_cluster with CandidatePlan.l2_ahead: each block first brings its segment of
    the rows l2_ahead waves ahead into L2."""
    return rms_norm_cluster(plan, _more(plan), _prefetch_ahead(plan, cluster_size(plan)))


def _weights_ahead(plan: Plan, A: int):
    """A macro, layer_norm_cluster's ``finish`` with CandidatePlan.wb_ahead: the weight and bias of
    the segment's first A chunks loaded into registers before the exchange, in flight while the
    block waits for its peers' partials, and those chunks' y computed from the registers."""
    N, vec, dt, R = plan.n, plan.vec, plan.dtype, plan.rows_per_block
    has_w, has_b = plan.has_weight, plan.has_bias
    K, _ = _smem_chunks(plan)
    exchange, store = _ln_exchange(plan, cluster_size(plan)), _store_rows(plan, has_b, A)

    @T.macro
    def finish(W, B, Y, xs, s1, s2, mine, slots, bar, row, base, rank, syv, eps, M):
        wa = T.alloc_fragment((A, K), dt)
        ba = T.alloc_fragment((A, K), dt)
        T.annotate_layout({wa: _rows_layout(plan, A, K), ba: _rows_layout(plan, A, K)})
        for a, j in T.Parallel(A, K):
            wa[a, j] = T.if_then_else(has_w and base + a * K + j < N, W[base + a * K + j], T.cast(0, dt))
            ba[a, j] = T.if_then_else(has_b and base + a * K + j < N, B[base + a * K + j], T.cast(0, dt))
        exchange(mine, slots, bar, rank, s1, s2, eps)
        for c in T.unroll(A):  # the same arithmetic as _affine, from the registers
            for r, j in T.Parallel(R, K):
                if base + c * K + j < N:
                    Y[T.cast(_row_of(row, r, M, R), "int64") * syv * vec + base + c * K + j] = T.cast(_affine(
                        (T.cast(xs[r, c * K + j], F32) - s1[r]) * s2[r], wa, ba, (c, j), has_w, has_b), dt)
        store(Y, xs, W, B, lambda r, x: (x - s1[r]) * s2[r], row, base, syv, M)
    return finish


def layer_norm_cluster_ahead(plan: Plan):
    """_long_programs.layer_norm_cluster with CandidatePlan.l2_ahead (as rms_norm_cluster_ahead) and
    CandidatePlan.wb_ahead (_weights_ahead)."""
    _, chunks = _smem_chunks(plan)
    A = min(plan.wb_ahead, chunks) if (plan.has_weight or plan.has_bias) else 0
    return layer_norm_cluster(plan, _more(plan), _prefetch_ahead(plan, cluster_size(plan)),
                              _weights_ahead(plan, A) if A else None)


def layer_norm_cluster_rows(plan: Plan):
    """LayerNorm, a cluster normalising Q = plan.seq_rows consecutive rows one after another (the
    plan's forms: statistics summed in the load, one-barrier block sums, the mbarrier exchange).
    Each block loads its weight and bias segments into shared memory once, so the rows after the
    first read them from there, not again from L2 (layer_norm_cluster reads 2 x N of them from L2
    for every row, twice the bytes of x in 16-bit). Row k's partials travel in slot set k % 2 and
    complete on mbarrier k % 2 (parity (k // 2) % 2): a peer sends row k + 2's partials only after
    it has this block's row k + 1, which this block sends after every thread read row k's slots
    (the block sums' barrier lies between), so no slot or phase is overwritten while in use. A
    cluster past row M - 1 normalises row M - 1 again (the same values to the same places). With
    CandidatePlan.l2_ahead, each block brings its segment of the next row into L2 as a row starts."""
    N, S, vec, dt, Q = plan.n, plan.padded, plan.vec, plan.dtype, plan.seq_rows
    assert plan.rows_per_block == 1 and plan.stats_in_load and plan.one_barrier_sum and plan.mbar_exchange, \
        "layer_norm_cluster_rows builds the plans' forms only"
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    NW, NB = _signature_sizes(plan)
    has_w, has_b = plan.has_weight, plan.has_bias
    last = N - (C - 1) * S  # columns of the last block; every other block has S
    lane_statistics, merge, prefetch_row = _lane_statistics(plan), _merge_partials(plan, C), _prefetch_row(plan)

    @T.macro
    def block(X, W, B, Y, MEAN, RSTD, sxv, syv, eps, bx, M):
        xs = T.alloc_shared((1, S), dt)
        wsm = T.alloc_shared((1, S), dt)
        bsm = T.alloc_shared((1, S), dt)
        xf = T.alloc_fragment((1, K), dt)
        sh = T.alloc_fragment((1, K), F32)
        acc = T.alloc_fragment((1, K), F32)
        acc2 = T.alloc_fragment((1, K), F32)
        s1 = T.alloc_fragment((1,), F32)
        s2 = T.alloc_fragment((1,), F32)
        vals = T.alloc_local((2,), F32)
        slots = T.alloc_shared((2, C, 2), F32)
        bar, ws = _helpers(plan, 2, barriers=2, more=_more(plan))
        T.annotate_layout({xf: _rows_layout(plan, 1, K), sh: _rows_layout(plan, 1, K),
                           acc: _rows_layout(plan, 1, K), acc2: _rows_layout(plan, 1, K)})
        rank = bx % C
        first = bx // C * Q
        base = rank * S
        nb = T.if_then_else(rank == C - 1, last, S)
        for r, j in T.Parallel(1, S):  # the block's weight and bias, once for its Q rows
            wsm[r, j] = T.if_then_else(has_w and base + j < N, W[T.min(base + j, NW - 1)], T.cast(0, dt))
            bsm[r, j] = T.if_then_else(has_b and base + j < N, B[T.min(base + j, NB - 1)], T.cast(0, dt))
        # Every peer's mbarriers are initialised (and fenced) before anyone completes on them.
        T.cluster_arrive_relaxed()
        T.cluster_wait()
        for k in T.serial(Q):
            row = T.min(first + k, M - 1)
            T.sync_threads()  # the last row's y pass read xs: every thread is past it
            if plan.l2_ahead:
                prefetch_row(X, T.min(first + k + 1, M - 1), base, sxv, M)
            if T.get_thread_binding() == 0:
                T.mbarrier_arrive_expect_tx(bar[k % 2], C * 2 * 4)
            lane_statistics(X, xs, xf, sh, acc, acc2, s1, s2, ws, row, base, nb, sxv, M)
            vals[0] = s1[0]
            vals[1] = s2[0]
            tx = T.get_thread_binding()
            if tx < C:
                for q in T.unroll(2):
                    T.call_extern("handle", "normdiff_put_f32", T.address_of(slots[k % 2, rank, q]), vals[q],
                                  T.address_of(bar[k % 2]), tx)
            T.mbarrier_wait_parity(bar[k % 2], (k // 2) % 2)
            merge(s1, s2, 0, lambda p, q: slots[k % 2, p, q], eps)
            for c in _chunk_loop(chunks):
                for r, j in T.Parallel(1, K):
                    if base + c * K + j < N:
                        Y[T.cast(row, "int64") * syv * vec + base + c * K + j] = T.cast(_affine(
                            (T.cast(xs[r, c * K + j], F32) - s1[0]) * s2[0], wsm, bsm, (r, c * K + j),
                            has_w, has_b), dt)
            if rank == 0:
                MEAN[row] = s1[0]
                RSTD[row] = s2[0]

    return _layer_norm_program(plan, Q, block)


BUILDERS = {"cluster_ahead": rms_norm_cluster_ahead, "layer_norm_cluster_ahead": layer_norm_cluster_ahead,
            "layer_norm_cluster_rows": layer_norm_cluster_rows}
