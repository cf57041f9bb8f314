"""The parts of the cluster programs (_long_programs): the device functions they import, the
exchange of partials between a cluster's blocks, block sums, and the loads and sums of a
block's segment. Each returns a T.macro (or a value) built for one plan."""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang._program_parts import F32
from impls.tilelang.plan import Plan

# st.async of one float32 into the same slot of cluster peer ``cta``, completing ``4`` bytes on
# that peer's mbarrier at the same offset as ``bar`` (mapa maps both addresses to the peer).
_PUT_SOURCE = r"""
__device__ __forceinline__ void normdiff_put_f32(void* slot, float value, void* bar, int cta) {
  unsigned s = (unsigned)__cvta_generic_to_shared(slot), b = (unsigned)__cvta_generic_to_shared(bar), rs, rb;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rs) : "r"(s), "r"(cta));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(b), "r"(cta));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
               :: "r"(rs), "f"(value), "r"(rb) : "memory");
}
"""

# A block's sum (Plan.one_barrier_sum): the thread's n values from v[first] in order, then an xor
# butterfly in each warp (every lane ends with the same bits: IEEE addition commutes), a warp's
# sum into ws[warp], one barrier, and every thread sums ws in warp order. TileLang's AllReduce
# takes two named barriers a round for each of log2(threads / 32) rounds instead. Each call needs
# a ws of its own: a thread may still read one call's ws while another writes the next's.
_BLOCK_SUM_SOURCE = r"""
__device__ __forceinline__ float normdiff_block_sum(const float* v, int first, int n, float* ws, int warps) {
  float s = v[first];
  for (int i = 1; i < n; ++i) s += v[first + i];
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = s;
  __syncthreads();
  s = ws[0];
  for (int w = 1; w < warps; ++w) s += ws[w];
  return s;
}
"""


def _helpers(plan: Plan, sums: int, barriers: int = 1, more: tuple = ()):
    """The kernel's device functions in the generated CUDA, ``more`` (a candidate's) after its
    own (one import: a second would replace the first), and (bar, ws): the ``barriers`` mbarriers
    of the mbarrier exchange (arrive count 1 each: the block's own arrive; None for the barrier
    exchange) and the shared workspace of ``sums`` one-barrier block sums (None without
    Plan.one_barrier_sum)."""
    sources = ([_PUT_SOURCE] if plan.mbar_exchange else []) + ([_BLOCK_SUM_SOURCE] if plan.one_barrier_sum else [])
    sources += list(more)
    if sources:
        T.import_source("".join(sources))
    bar = T.alloc_barrier([1] * barriers) if plan.mbar_exchange else None
    ws = T.alloc_shared((sums, plan.threads // 32), F32) if plan.one_barrier_sum else None
    return bar, ws


def _block_sum(plan: Plan):
    """A macro: out[r] = the block's sum of acc's row r (R = plan.rows_per_block rows), by
    TileLang's reduce_sum or, with Plan.one_barrier_sum, by normdiff_block_sum on each thread's
    own vec values of the row (ws rows first..first + R - 1)."""
    R, vec, warps = plan.rows_per_block, plan.vec, plan.threads // 32

    @T.macro
    def block_sum(acc, out, ws, first):
        if plan.one_barrier_sum:
            for r in T.unroll(R):  # acc.data: the thread's own values (a BufferLoad would tie layouts)
                out[r] = T.call_extern(F32, "normdiff_block_sum", acc.data, r * vec, vec,
                                       T.address_of(ws[first + r, 0]), warps)
        else:
            T.reduce_sum(acc, out, dim=1)
    return block_sum


def _exchange(plan: Plan, C: int, W: int):
    """Macros (start, send) of the exchange of W float32 partials per block between the C blocks
    of a cluster (see the module's barriers): ``start`` before the loads, ``send`` once the
    block's partials are in ``mine`` (or, where partials_in_registers(plan), in every thread's
    registers, as ``value(k)``); after ``send`` slot p holds peer p's partials."""
    mbar, registers = plan.mbar_exchange, partials_in_registers(plan)

    @T.macro
    def start(slots, bar):
        if mbar:
            if T.get_thread_binding() == 0:
                T.mbarrier_arrive_expect_tx(bar[0], C * W * 4)
        if plan.relaxed_arrive:
            T.cluster_arrive_relaxed()
        else:
            if not mbar:  # zeroed so that the slots are live across the block reduction
                for p, k in T.Parallel(C, W):
                    slots[p, k] = 0.0
            T.cluster_arrive()

    @T.macro
    def send(mine, slots, bar, rank, value):
        T.cluster_wait()
        if mbar:
            tx = T.get_thread_binding()
            if registers:
                # value(k): partial k, which every thread holds after normdiff_block_sum (no staging
                # in ``mine``, no barrier for it); read by all threads, into local registers, since a
                # fragment read only under ``tx < C`` would have TileLang compute it there only
                vals = T.alloc_local((W,), F32)
                for k in T.unroll(W):
                    vals[k] = value(k)
            if tx < C:
                for k in T.unroll(W):
                    T.call_extern("handle", "normdiff_put_f32", T.address_of(slots[rank, k]),
                                  vals[k] if registers else mine[k], T.address_of(bar[0]), tx)
            T.mbarrier_wait_parity(bar[0], 0)
        else:
            for p in T.serial(C):
                T.copy_cluster(mine[0:W], slots[rank, 0:W], dst_block=p)
            T.cluster_sync()

    return start, send


def partials_in_registers(plan: Plan) -> bool:
    """Whether the mbarrier exchange puts the block's partials from registers: every thread holds
    the same block sums after normdiff_block_sum, so none go through shared memory first."""
    return plan.mbar_exchange and plan.one_barrier_sum


def _smem_chunks(plan: Plan):
    """(K, chunks): one chunk is one vector per thread (K = threads x vec columns); a block's
    segment of S columns is S // K chunks (the plan makes S a multiple of K); with rows_per_block
    R > 1 the same threads carry all R rows (plan.rows_share_threads)."""
    K = plan.threads * plan.vec
    return K, plan.padded // K


def _rows_layout(plan: Plan, rows: int, cols: int):
    """Fragment layout of a (rows, cols) tile, cols = threads x vec: column j to thread
    (j // vec) % threads for every row, so a thread applies one weight vector to all its rows
    and each row is summed in the same order whichever of the block's rows it is."""
    threads, vec = plan.threads, plan.vec
    return T.Fragment(
        (rows, cols),
        forward_thread_fn=lambda r, j: (j // vec) % threads,
        forward_index_fn=lambda r, j: r * vec + j % vec,
    )


def _chunk_loop(chunks: int):
    return T.unroll(chunks) if chunks <= 16 else T.serial(chunks)


def _segment_loader(plan: Plan):
    """A macro that loads the block's segment of row ``row`` into shared memory, columns from
    ``base``, by the threads (padded lanes zero)."""
    N, S, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype

    R = plan.rows_per_block
    if R == 1:
        @T.macro
        def load(X, xs, row, base, sxv, M):
            for r, j in T.Parallel(1, S):
                xs[r, j] = T.if_then_else(
                    base + j < N, X[T.cast(row, "int64") * sxv * vec + base + j], T.cast(0, dt))
    else:  # _row_of: the last block's rows past M are row M - 1 again
        @T.macro
        def load(X, xs, row, base, sxv, M):
            for r, j in T.Parallel(R, S):
                xs[r, j] = T.if_then_else(
                    base + j < N, X[T.cast(T.min(row + r, M - 1), "int64") * sxv * vec + base + j], T.cast(0, dt))
    return load


def _chunk_loader(plan: Plan):
    """A macro that loads columns [col, col + K) of the block's rows into the fragment ``xf``
    (padded lanes zero), for the kernels that sum a chunk in registers before it goes to shared
    memory (Plan.stats_in_load)."""
    N, vec, dt, R = plan.n, plan.vec, plan.dtype, plan.rows_per_block

    @T.macro
    def load(X, xf, row, col, sxv, M):
        for r, j in T.Parallel(R, plan.threads * vec):
            xf[r, j] = T.if_then_else(
                col + j < N, X[T.cast(_row_of(row, r, M, R), "int64") * sxv * vec + col + j], T.cast(0, dt))
    return load


def _lane_count(plan: Plan, base, j):
    """How many of the block's chunks hold a column of lane j (float32): chunks, but for the lanes
    of the last block past N."""
    K, chunks = _smem_chunks(plan)
    return T.cast(T.if_then_else(plan.n - base - j > 0, T.min(T.ceildiv(plan.n - base - j, K), chunks), 0), F32)


def _row_of(row, r, M, R: int):
    """Row r of a block whose first row is ``row``. With R > 1 the last block may reach past M: it
    carries row M - 1 again in the missing places (the same values written twice by the same
    thread), so no load or store needs a row mask and the weight loads are shared by all R rows."""
    return row if R == 1 else T.min(row + r, M - 1)


def _lane_statistics(plan: Plan):
    """A macro (Plan.stats_in_load, LayerNorm): the block's R rows loaded chunk by chunk into
    shared memory ``xs``, each lane's values summed on the way by Welford's update (sh: the lane's
    mean, acc2: its M2 about it; padded values leave both as they are), then s1[r] = the block's
    sum and s2[r] = its M2 about the block's mean, from the lanes' by Chan's combination (block
    sums in ws rows 0..R-1 and R..2R-1). A sum of squares about the lane's first value cancelled
    where that value was an outlier (the GPU fuzz test: float32 4 x 16384 outlier_first, vec 1,
    32 values a lane, rstd 2e-6 off); Welford's update has no such cancellation."""
    N, R = plan.n, plan.rows_per_block
    K, chunks = _smem_chunks(plan)
    load_chunk, block_sum = _chunk_loader(plan), _block_sum(plan)

    @T.macro
    def statistics(X, xs, xf, sh, acc, acc2, s1, s2, ws, row, base, nb, sxv, M):
        load_chunk(X, xf, row, base, sxv, M)
        for r, j in T.Parallel(R, K):
            xs[r, j] = xf[r, j]
        for r, j in T.Parallel(R, K):
            sh[r, j] = T.cast(xf[r, j], F32)
            acc2[r, j] = 0.0
        for c in _chunk_loop(chunks - 1):
            load_chunk(X, xf, row, base + (c + 1) * K, sxv, M)
            for r, j in T.Parallel(R, K):
                xs[r, (c + 1) * K + j] = xf[r, j]
            for r, j in T.Parallel(R, K):  # the lane's (c + 2)-th value, if it has one
                acc[r, j] = T.if_then_else(base + (c + 1) * K + j < N, T.cast(xf[r, j], F32) - sh[r, j], 0.0)
                sh[r, j] = sh[r, j] + acc[r, j] * (1.0 / T.cast(c + 2, F32))
                acc2[r, j] = acc2[r, j] + acc[r, j] * (T.cast(xf[r, j], F32) - sh[r, j])
        for r, j in T.Parallel(R, K):  # acc: the lane's sum
            acc[r, j] = _lane_count(plan, base, j) * sh[r, j]
        block_sum(acc, s1, ws, 0)
        for r, j in T.Parallel(R, K):
            acc[r, j] = acc2[r, j] + _lane_count(plan, base, j) * (sh[r, j] - s1[r] / nb) * (sh[r, j] - s1[r] / nb)
        block_sum(acc, s2, ws, R)
    return statistics


def _merge_partials(plan: Plan, C: int):
    """A macro (LayerNorm): s1[r] = the row's mean and s2[r] = its rstd from the C blocks'
    partials, ``slot(p, 0)`` block p's sum and ``slot(p, 1)`` its M2 about its own mean, merged in
    rank order: M2 = sum of M2_p + n_p (m_p - mean)^2 (no E[x^2] - E[x]^2 cancellation)."""
    N, S = plan.n, plan.padded
    last = N - (C - 1) * S  # columns of the last block; every other block has S

    @T.macro
    def merge(s1, s2, r, slot, eps):
        s1[r] = 0.0
        for p in T.serial(C):
            s1[r] += slot(p, 0)
        s1[r] = s1[r] / N  # the row's mean
        s2[r] = 0.0
        for p in T.serial(C):
            s2[r] += slot(p, 1) + T.if_then_else(p == C - 1, last, S) * (
                slot(p, 0) / T.if_then_else(p == C - 1, last, S) - s1[r]) * (
                slot(p, 0) / T.if_then_else(p == C - 1, last, S) - s1[r])
        s2[r] = T.rsqrt(s2[r] / N + eps)  # s2 now holds rstd
    return merge
