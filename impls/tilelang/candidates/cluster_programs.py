"""The cluster candidates' programs: impls/tilelang/_long_programs' kernels with the choices of
plans.CandidatePlan (not measured yet: docs/perf-notes.md, item 58). Each block's segment of the
rows a wave ahead brought into L2 (l2_ahead), the first chunks' weight and bias loaded ahead of
the wait for the peers (wb_ahead), and LayerNorm's rows normalised in turn by one cluster
(seq_rows). At zero each builds the registered kernel's program.
"""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T
import torch

from impls.tilelang._cluster_parts import (_BLOCK_SUM_SOURCE, _PUT_SOURCE, _block_sum, _chunk_loader, _chunk_loop,
                                           _exchange, _lane_statistics, _merge_partials, _row_of, _rows_layout,
                                           _segment_loader, _smem_chunks, partials_in_registers)
from impls.tilelang._long_plan import cluster_size
from impls.tilelang._programs import F32, _affine, _signature_sizes
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


def _helpers_ahead(plan: Plan, sums: int, barriers: int = 1):
    """_cluster_parts._helpers with the prefetch's device functions (one import of them all)."""
    sources = ([_PUT_SOURCE] if plan.mbar_exchange else []) + ([_BLOCK_SUM_SOURCE] if plan.one_barrier_sum else []) + (
        [_PREFETCH_SOURCE] if plan.l2_ahead else [])
    if sources:
        T.import_source("".join(sources))
    bar = T.alloc_barrier([1] * barriers) if plan.mbar_exchange else None
    ws = T.alloc_shared((sums, plan.threads // 32), F32) if plan.one_barrier_sum else None
    return bar, ws


def rms_norm_cluster_ahead(plan: Plan):
    """_long_programs.rms_norm_cluster with CandidatePlan.l2_ahead: each block first brings its segment of
    the rows l2_ahead waves ahead into L2."""
    N, S, vec, dt, R = plan.n, plan.padded, plan.vec, plan.dtype, plan.rows_per_block
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w = plan.has_weight

    load_segment = _segment_loader(plan)
    load_chunk = _chunk_loader(plan) if plan.stats_in_load else None
    start_exchange, send_partials = _exchange(plan, C, R)
    block_sum = _block_sum(plan)
    prefetch_ahead = _prefetch_ahead(plan, C)

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), dt),
        RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(M, R) * C, threads=plan.threads, cluster_dims=(C, 1, 1)) as bx:
            if plan.min_blocks:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            xs = T.alloc_shared((R, S), dt)
            acc = T.alloc_fragment((R, K), F32)
            ss = T.alloc_fragment((R,), F32)
            mine = T.alloc_shared((R,), F32)
            slots = T.alloc_shared((C, R), F32)
            bar, ws = _helpers_ahead(plan, R)
            T.annotate_layout({acc: _rows_layout(plan, R, K)})
            start_exchange(slots, bar)
            row = bx // C * R  # the block's first row
            base = (bx % C) * S
            prefetch_ahead(X, row, base, sxv, M)
            for r, j in T.Parallel(R, K):
                acc[r, j] = 0.0
            if plan.stats_in_load:  # each chunk summed from registers on its way to shared memory
                xf = T.alloc_fragment((R, K), dt)
                T.annotate_layout({xf: _rows_layout(plan, R, K)})
                for c in _chunk_loop(chunks):
                    load_chunk(X, xf, row, base + c * K, sxv, M)
                    for r, j in T.Parallel(R, K):
                        xs[r, c * K + j] = xf[r, j]
                    for r, j in T.Parallel(R, K):
                        acc[r, j] += T.cast(xf[r, j], F32) * T.cast(xf[r, j], F32)
            else:
                load_segment(X, xs, row, base, sxv, M)
                for c in _chunk_loop(chunks):
                    for r, j in T.Parallel(R, K):
                        acc[r, j] += T.cast(xs[r, c * K + j], F32) * T.cast(xs[r, c * K + j], F32)
            block_sum(acc, ss, ws, 0)
            if not partials_in_registers(plan):
                for r in T.Parallel(R):
                    mine[r] = ss[r]
            # Every block's partial into slot rank of every peer (see the module's barriers).
            send_partials(mine, slots, bar, bx % C, lambda k: ss[k])
            for r in T.unroll(R):
                ss[r] = 0.0
                for p in T.serial(C):  # rank order: the same sum in every block
                    ss[r] += slots[p, r]
                ss[r] = T.rsqrt(ss[r] / N + eps)
            for c in _chunk_loop(chunks):
                for r, j in T.Parallel(R, K):
                    if base + c * K + j < N:
                        Y[T.cast(_row_of(row, r, M, R), "int64") * syv * vec + base + c * K + j] = T.cast(_affine(
                            T.cast(xs[r, c * K + j], F32) * ss[r], W, None, base + c * K + j, has_w, False), dt)
            if bx % C == 0:
                for r in T.unroll(R):
                    RSTD[_row_of(row, r, M, R)] = ss[r]

    return main


def layer_norm_cluster_ahead(plan: Plan):
    """_long_programs.layer_norm_cluster with CandidatePlan.l2_ahead (as rms_norm_cluster_ahead) and
    CandidatePlan.wb_ahead: the weight and bias of the segment's first wb_ahead chunks loaded into
    registers after the block sums, in flight while the block waits for its peers' partials."""
    N, S, vec, dt, R = plan.n, plan.padded, plan.vec, plan.dtype, plan.rows_per_block
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    NW, NB = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w, has_b = plan.has_weight, plan.has_bias
    last = N - (C - 1) * S  # columns of the last block; every other block has S
    A = min(plan.wb_ahead, chunks) if (has_w or has_b) else 0

    load_segment = _segment_loader(plan)
    start_exchange, send_partials = _exchange(plan, C, 2 * R)
    block_sum = _block_sum(plan)
    prefetch_ahead = _prefetch_ahead(plan, C)
    lane_statistics = _lane_statistics(plan) if plan.stats_in_load else None
    merge = _merge_partials(plan, C)

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt), Y: T.Tensor((LY,), dt),
        MEAN: T.Tensor((M,), F32), RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(M, R) * C, threads=plan.threads, cluster_dims=(C, 1, 1)) as bx:
            if plan.min_blocks:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            xs = T.alloc_shared((R, S), dt)
            acc = T.alloc_fragment((R, K), F32)
            s1 = T.alloc_fragment((R,), F32)
            s2 = T.alloc_fragment((R,), F32)
            mine = T.alloc_shared((2 * R,), F32)
            slots = T.alloc_shared((C, 2 * R), F32)
            bar, ws = _helpers_ahead(plan, 2 * R)
            T.annotate_layout({acc: _rows_layout(plan, R, K)})
            start_exchange(slots, bar)
            row = bx // C * R  # the block's first row
            base = (bx % C) * S
            prefetch_ahead(X, row, base, sxv, M)
            nb = T.if_then_else(bx % C == C - 1, last, S)
            if plan.stats_in_load:  # each lane's values summed on their way to shared memory
                xf = T.alloc_fragment((R, K), dt)
                sh = T.alloc_fragment((R, K), F32)
                acc2 = T.alloc_fragment((R, K), F32)
                T.annotate_layout({xf: _rows_layout(plan, R, K), sh: _rows_layout(plan, R, K),
                                   acc2: _rows_layout(plan, R, K)})
                lane_statistics(X, xs, xf, sh, acc, acc2, s1, s2, ws, row, base, nb, sxv, M)
            else:
                load_segment(X, xs, row, base, sxv, M)
                for r, j in T.Parallel(R, K):
                    acc[r, j] = 0.0
                for c in _chunk_loop(chunks):
                    for r, j in T.Parallel(R, K):
                        acc[r, j] += T.cast(xs[r, c * K + j], F32)
                block_sum(acc, s1, ws, 0)
                for r, j in T.Parallel(R, K):
                    acc[r, j] = 0.0
                for c in _chunk_loop(chunks):
                    for r, j in T.Parallel(R, K):
                        acc[r, j] += T.if_then_else(base + c * K + j < N, (T.cast(xs[r, c * K + j], F32) - s1[r] / nb) * (
                            T.cast(xs[r, c * K + j], F32) - s1[r] / nb), 0.0)
                block_sum(acc, s2, ws, R)
            if not partials_in_registers(plan):
                for r in T.Parallel(R):
                    mine[2 * r] = s1[r]
                    mine[2 * r + 1] = s2[r]
            if A:  # the first A chunks' weight and bias, in flight while the block waits for its peers
                wa = T.alloc_fragment((A, K), dt)
                ba = T.alloc_fragment((A, K), dt)
                T.annotate_layout({wa: _rows_layout(plan, A, K), ba: _rows_layout(plan, A, K)})
                for a, j in T.Parallel(A, K):
                    wa[a, j] = T.if_then_else(has_w and base + a * K + j < N, W[base + a * K + j], T.cast(0, dt))
                    ba[a, j] = T.if_then_else(has_b and base + a * K + j < N, B[base + a * K + j], T.cast(0, dt))
            send_partials(mine, slots, bar, bx % C, lambda k: T.if_then_else(k % 2 == 0, s1[k // 2], s2[k // 2]))
            for r in T.unroll(R):
                merge(s1, s2, r, lambda p, q: slots[p, 2 * r + q], eps)
            if A:
                for c in T.unroll(A):  # the same arithmetic as _affine, from the registers
                    for r, j in T.Parallel(R, K):
                        if base + c * K + j < N:
                            Y[T.cast(_row_of(row, r, M, R), "int64") * syv * vec + base + c * K + j] = T.cast(_affine(
                                (T.cast(xs[r, c * K + j], F32) - s1[r]) * s2[r], wa, ba, (c, j), has_w, has_b), dt)
            for c in _chunk_loop(chunks - A):
                for r, j in T.Parallel(R, K):
                    if base + (c + A) * K + j < N:
                        Y[T.cast(_row_of(row, r, M, R), "int64") * syv * vec + base + (c + A) * K + j] = T.cast(_affine(
                            (T.cast(xs[r, (c + A) * K + j], F32) - s1[r]) * s2[r], W, B, base + (c + A) * K + j,
                            has_w, has_b), dt)
            if bx % C == 0:
                for r in T.unroll(R):
                    MEAN[_row_of(row, r, M, R)] = s1[r]
                    RSTD[_row_of(row, r, M, R)] = s2[r]

    return main


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
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w, has_b = plan.has_weight, plan.has_bias
    last = N - (C - 1) * S  # columns of the last block; every other block has S
    lane_statistics, merge, prefetch_row = _lane_statistics(plan), _merge_partials(plan, C), _prefetch_row(plan)

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt), Y: T.Tensor((LY,), dt),
        MEAN: T.Tensor((M,), F32), RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(M, Q) * C, threads=plan.threads, cluster_dims=(C, 1, 1)) as bx:
            if plan.min_blocks:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
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
            bar, ws = _helpers_ahead(plan, 2, barriers=2)
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

    return main


BUILDERS = {"cluster_ahead": rms_norm_cluster_ahead, "layer_norm_cluster_ahead": layer_norm_cluster_ahead,
            "layer_norm_cluster_rows": layer_norm_cluster_rows}
