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
padded lanes read as zero and never stored). The macros they are built of: _cluster_parts. The
probe's candidate programs (impls/tilelang/candidates/cluster_programs) are these builders given a
candidate's parts (``more``, ``ahead``, ``finish``), or built of the same macros.
"""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang._cluster_parts import (_block_sum, _chunk_loader, _chunk_loop, _exchange, _helpers,
                                           _lane_statistics, _merge_partials, _row_of, _rows_layout,
                                           _segment_loader, _smem_chunks, partials_in_registers)
from impls.tilelang._long_plan import cluster_size
from impls.tilelang._program_parts import F32, _affine, _signature_sizes
from impls.tilelang.plan import Plan


@T.macro
def _nothing_ahead(X, row, base, sxv, M):  # the registered programs' ``ahead``: nothing
    pass


def _store_rows(plan: Plan, has_b: bool, first: int = 0):
    """A macro: y of the block's R rows from shared memory ``xs``, chunks ``first`` on (earlier
    ones are the caller's), y = _affine(norm(r, x)) with W (and B where ``has_b``); padded
    columns are not stored."""
    N, vec, dt, R = plan.n, plan.vec, plan.dtype, plan.rows_per_block
    K, chunks = _smem_chunks(plan)

    @T.macro
    def store(Y, xs, W, B, norm, row, base, syv, M):
        for c in _chunk_loop(chunks - first):
            for r, j in T.Parallel(R, K):
                if base + (c + first) * K + j < N:
                    Y[T.cast(_row_of(row, r, M, R), "int64") * syv * vec + base + (c + first) * K + j] = T.cast(_affine(
                        norm(r, T.cast(xs[r, (c + first) * K + j], F32)), W, B, base + (c + first) * K + j,
                        plan.has_weight, has_b), dt)
    return store


def rms_norm_cluster(plan: Plan, more: tuple = (), ahead=_nothing_ahead):
    """RMSNorm: each block's sum of squares, summed over the cluster in rank order. A probe
    candidate (impls/tilelang/candidates) is this program with ``more``, device functions it
    calls (_helpers), and ``ahead``, a macro ahead(X, row, base, sxv, M) run once the block knows
    its rows, before it loads them."""
    N, S, dt, R = plan.n, plan.padded, plan.dtype, plan.rows_per_block
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    NW, _ = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")

    load_segment = _segment_loader(plan)
    load_chunk = _chunk_loader(plan) if plan.stats_in_load else None
    start_exchange, send_partials = _exchange(plan, C, R)
    block_sum = _block_sum(plan)
    store = _store_rows(plan, False)

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
            bar, ws = _helpers(plan, R, more=more)
            T.annotate_layout({acc: _rows_layout(plan, R, K)})
            start_exchange(slots, bar)
            row = bx // C * R  # the block's first row
            base = (bx % C) * S
            ahead(X, row, base, sxv, M)
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
            store(Y, xs, W, None, lambda r, x: x * ss[r], row, base, syv, M)
            if bx % C == 0:
                for r in T.unroll(R):
                    RSTD[_row_of(row, r, M, R)] = ss[r]

    return main


def _ln_exchange(plan: Plan, C: int):
    """A macro (LayerNorm): the block's partials (mine, or s1 and s2 where
    partials_in_registers) to every peer, then s1[r] = row r's mean and s2[r] = its rstd from
    the C blocks' partials (_merge_partials)."""
    _, send_partials = _exchange(plan, C, 2 * plan.rows_per_block)
    merge = _merge_partials(plan, C)

    @T.macro
    def exchange(mine, slots, bar, rank, s1, s2, eps):
        send_partials(mine, slots, bar, rank, lambda k: T.if_then_else(k % 2 == 0, s1[k // 2], s2[k // 2]))
        for r in T.unroll(plan.rows_per_block):
            merge(s1, s2, r, lambda p, q: slots[p, 2 * r + q], eps)
    return exchange


def _layer_norm_program(plan: Plan, rows: int, block):
    """A LayerNorm cluster program: its signature, and ceil(M / rows) clusters of
    cluster_size(plan) blocks, each running the macro block(X, W, B, Y, MEAN, RSTD, sxv, syv, eps,
    bx, M) (bx: the block's index in the grid)."""
    C, dt = cluster_size(plan), plan.dtype
    NW, NB = _signature_sizes(plan)
    M, LX, LY = T.dynamic("M"), T.dynamic("LX", "int64"), T.dynamic("LY", "int64")

    @T.prim_func
    def main(
        X: T.Tensor((LX,), dt), W: T.Tensor((NW,), dt), B: T.Tensor((NB,), dt), Y: T.Tensor((LY,), dt),
        MEAN: T.Tensor((M,), F32), RSTD: T.Tensor((M,), F32), sxv: T.int64, syv: T.int64, eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(M, rows) * C, threads=plan.threads, cluster_dims=(C, 1, 1)) as bx:
            if plan.min_blocks:
                T.annotate_min_blocks_per_sm(plan.min_blocks)
            block(X, W, B, Y, MEAN, RSTD, sxv, syv, eps, bx, M)

    return main


def layer_norm_cluster(plan: Plan, more: tuple = (), ahead=_nothing_ahead, finish=None):
    """LayerNorm, with two partials per block: the sum of its n_b columns and the sum of squares
    about its own mean m_b (two passes over shared memory). After the exchange, mean = sum / N
    and the row's M2 = sum over blocks of M2_b + n_b (m_b - mean)^2, in rank order: no
    E[x^2] - E[x]^2 cancellation, one exchange. A probe candidate is this program with ``more``
    and ``ahead`` (as rms_norm_cluster's) and ``finish``, a macro finish(W, B, Y, xs, s1, s2,
    mine, slots, bar, row, base, rank, syv, eps, M) in place of the exchange and the stores of y."""
    N, S, dt, R = plan.n, plan.padded, plan.dtype, plan.rows_per_block
    C = cluster_size(plan)
    K, chunks = _smem_chunks(plan)
    last = N - (C - 1) * S  # columns of the last block; every other block has S

    load_segment = _segment_loader(plan)
    start_exchange, _ = _exchange(plan, C, 2 * R)
    block_sum = _block_sum(plan)
    lane_statistics = _lane_statistics(plan) if plan.stats_in_load else None
    exchange, store = _ln_exchange(plan, C), _store_rows(plan, plan.has_bias)

    @T.macro
    def block(X, W, B, Y, MEAN, RSTD, sxv, syv, eps, bx, M):
        xs = T.alloc_shared((R, S), dt)
        acc = T.alloc_fragment((R, K), F32)
        s1 = T.alloc_fragment((R,), F32)
        s2 = T.alloc_fragment((R,), F32)
        mine = T.alloc_shared((2 * R,), F32)
        slots = T.alloc_shared((C, 2 * R), F32)
        bar, ws = _helpers(plan, 2 * R, more=more)
        T.annotate_layout({acc: _rows_layout(plan, R, K)})
        start_exchange(slots, bar)
        row = bx // C * R  # the block's first row
        base = (bx % C) * S
        ahead(X, row, base, sxv, M)
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
        if finish is None:
            exchange(mine, slots, bar, bx % C, s1, s2, eps)
            store(Y, xs, W, B, lambda r, x: (x - s1[r]) * s2[r], row, base, syv, M)
        else:
            finish(W, B, Y, xs, s1, s2, mine, slots, bar, row, base, bx % C, syv, eps, M)
        if bx % C == 0:
            for r in T.unroll(R):
                MEAN[_row_of(row, r, M, R)] = s1[r]
                RSTD[_row_of(row, r, M, R)] = s2[r]

    return _layer_norm_program(plan, R, block)


BUILDERS = {"cluster": rms_norm_cluster, "layer_norm_cluster": layer_norm_cluster}
