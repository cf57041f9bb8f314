"""Long-row TileLang programs: one row over a thread-block cluster (sm_90), x read once.

Block b of the grid (M x CLUSTER blocks, clusters of CLUSTER consecutive blocks) loads columns
[rank * S, rank * S + S) of row b // CLUSTER into shared memory (S = plan.padded, rank =
b % CLUSTER, its rank in the cluster), reduces it from there, then writes its partial statistics
into slot ``rank`` of every cluster peer's shared memory (distributed shared memory), and once
its own slots are complete every block sums the CLUSTER slots in rank order: the same float32
value in every block of the row, in an order that depends on neither M nor the launch, so the
kernels are deterministic and batch invariant. Each block then scales its segment from shared
memory and stores it.

A block may carry R = plan.rows_per_block consecutive rows (grid ceil(M / R) x CLUSTER): its
threads work on each (_rows_layout), one weight and bias load serves all R, and each row's
partials travel in slots of their own. A row is summed in the same order whichever of the R it
is, so its bits depend on neither M nor its place in the block; the last block repeats row
M - 1 where M is not a multiple of R.

The segment lives in shared memory, not registers, so a thread holds a few vectors at a time and
several blocks (of different clusters) share an SM (the plan's launch bound): one block's loads
run while another waits for its peers. A segment in registers instead (one block an SM at
N = 262144) measured 55-78% of copy against 74-90% (docs/perf-notes.md item 44).

The exchange (the plans' rule, _long_plan.MBAR_EXCHANGE; docs/perf-notes.md item 56): thread
p < CLUSTER of each block writes the block's partials into slot ``rank`` of peer p by st.async,
which completes on peer p's mbarrier; each block's own arrive on its mbarrier expects CLUSTER x
the partials' bytes, and every thread waits on it before summing the slots. No cluster barrier
follows the stores: a block leaves once every peer's partials are in its own slots, and no peer
writes to it after that. The one cluster barrier (arrive after the mbarrier's initialisation and
its fence.mbarrier_init, wait before the first remote store) makes every peer's mbarrier ready
before anyone completes on it; its arrive is relaxed (Plan.relaxed_arrive), since the
initialisation fence already releases what the peers need.

The barrier exchange (the probe's alternative, Plan.mbar_exchange False): the slots are zeroed
first, so that they are live across the block reduction (TileLang would otherwise place the
reduction's workspace over them), each block arrives on the cluster barrier (with release
semantics, or relaxed with Plan.relaxed_arrive and the slots unzeroed) and waits on it only
before its remote stores (copy_cluster); a second full cluster barrier after the stores makes
the slots complete, and no block exits while a peer may still write to it. A relaxed arrive or
the mbarrier exchange gives the slots shared memory of their own (compiler.SLOTS_OWN_MEMORY).

Conventions otherwise as in _programs (flat x and y, strides in units of vec, M symbolic,
padded lanes read as zero and never stored).

The TMA form (plan variants ending _long_plan.TMA; a probe candidate, _candidates.cluster_tma)
takes x as M x N rows and loads each segment with the tensor memory accelerator, straight into
shared memory (docs/perf-notes.md item 53: correct, and slower at the rule's launch bound).
"""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T
import torch

from tilelang.cuda.language import copy as cuda_copy

from impls.tilelang._long_plan import TMA, cluster_size
from impls.tilelang._programs import F32, _affine, _signature_sizes
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

# Plan.l2_ahead: thread 0 brings the 16-byte-aligned span of ``bytes`` bytes at ``col_bytes`` into
# row ``row`` of x into L2 (cp.async.bulk.prefetch, sm_90; no registers, no shared memory); nothing
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
    """A macro: with Plan.l2_ahead, the block's segment of each of its rows l2_ahead waves ahead
    into L2 (a wave: SMs x blocks an SM / C blocks a cluster x rows a block); nothing otherwise."""
    per_sm = plan.l2_ahead * (plan.min_blocks or 1) * plan.rows_per_block
    prefetch_row = _prefetch_row(plan)

    @T.macro
    def prefetch(X, row, base, sxv, M):
        if plan.l2_ahead:
            for r in T.unroll(plan.rows_per_block):
                prefetch_row(X, row + r + T.call_extern("int32", "normdiff_sm_count") * per_sm // C, base, sxv, M)
    return prefetch


def _helpers(plan: Plan, sums: int, barriers: int = 1):
    """The kernel's device functions in the generated CUDA (one import: a second would replace
    the first), and (bar, ws): the ``barriers`` mbarriers of the mbarrier exchange (arrive count
    1 each: the block's own arrive; None for the barrier exchange) and the shared workspace of
    ``sums`` one-barrier block sums (None without Plan.one_barrier_sum)."""
    sources = ([_PUT_SOURCE] if plan.mbar_exchange else []) + ([_BLOCK_SUM_SOURCE] if plan.one_barrier_sum else []) + (
        [_PREFETCH_SOURCE] if plan.l2_ahead else [])
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


def _x_param(plan: Plan, M, LX):
    """x's parameter: flat (LX elements, rows sxv vectors apart), or for the TMA form (plan
    variants ending TMA) the M x N rows with a run-time row stride, which the tensor map needs."""
    if plan.variant.endswith(TMA):
        return T.StridedTensor((M, plan.n), (T.dynamic("SX"), 1), plan.dtype)
    return T.Tensor((LX,), plan.dtype)


def _segment_loader(plan: Plan):
    """A macro that loads the block's segment of row ``row`` into shared memory, columns from
    ``base``: by the threads (padded lanes zero), or in the TMA form by the tensor memory
    accelerator, whose out-of-bounds lanes read zero, straight into shared memory past registers
    and L1."""
    N, S, vec, dt = plan.n, plan.padded, plan.vec, plan.dtype

    R = plan.rows_per_block
    if plan.variant.endswith(TMA):
        assert R == 1, "the TMA form carries one row a block"

        @T.macro
        def load(X, xs, row, base, sxv, M):
            cuda_copy(X[row:row + 1, base:base + S], xs, prefer_instruction="tma")
    elif R == 1:
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
    assert not plan.variant.endswith(TMA), "the TMA form loads straight into shared memory"

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


def rms_norm_cluster(plan: Plan):
    """RMSNorm: each block's sum of squares, summed over the cluster in rank order."""
    N, S, vec, dt, R = plan.n, plan.padded, plan.vec, plan.dtype, plan.rows_per_block
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w = plan.has_weight

    XT, load_segment = _x_param(plan, M, LX), _segment_loader(plan)
    load_chunk = _chunk_loader(plan) if plan.stats_in_load else None
    start_exchange, send_partials = _exchange(plan, C, R)
    block_sum = _block_sum(plan)
    prefetch_ahead = _prefetch_ahead(plan, C)

    @T.prim_func
    def main(
        X: XT, W: T.Tensor((NW,), dt), Y: T.Tensor((LY,), dt),
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
            bar, ws = _helpers(plan, R)
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


def layer_norm_cluster(plan: Plan):
    """LayerNorm, with two partials per block: the sum of its n_b columns and the sum of squares
    about its own mean m_b (two passes over shared memory). After the exchange, mean = sum / N
    and the row's M2 = sum over blocks of M2_b + n_b (m_b - mean)^2, in rank order: no
    E[x^2] - E[x]^2 cancellation, one exchange."""
    if plan.seq_rows:
        return layer_norm_cluster_rows(plan)
    N, S, vec, dt, R = plan.n, plan.padded, plan.vec, plan.dtype, plan.rows_per_block
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    NW, NB = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")
    has_w, has_b = plan.has_weight, plan.has_bias
    last = N - (C - 1) * S  # columns of the last block; every other block has S
    A = min(plan.wb_ahead, chunks) if (has_w or has_b) else 0

    XT, load_segment = _x_param(plan, M, LX), _segment_loader(plan)
    start_exchange, send_partials = _exchange(plan, C, 2 * R)
    block_sum = _block_sum(plan)
    prefetch_ahead = _prefetch_ahead(plan, C)
    lane_statistics = _lane_statistics(plan) if plan.stats_in_load else None
    merge = _merge_partials(plan, C)

    @T.prim_func
    def main(
        X: XT, W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt), Y: T.Tensor((LY,), dt),
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
            bar, ws = _helpers(plan, 2 * R)
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
    Plan.l2_ahead, each block brings its segment of the next row into L2 as a row starts."""
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
            bar, ws = _helpers(plan, 2, barriers=2)
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


BUILDERS = {"cluster": rms_norm_cluster, "layer_norm_cluster": layer_norm_cluster,
            "cluster" + TMA: rms_norm_cluster, "layer_norm_cluster" + TMA: layer_norm_cluster}
