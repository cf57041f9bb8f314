"""Plans of the long-row cluster kernels (_long_programs): one row over a thread-block cluster of
CLUSTER blocks, each holding its segment of the row in shared memory. Plain Python: no tilelang
import.

The cluster size is not a Plan field: it is ceil(N / plan.padded), plan.padded being one block's
segment (a multiple of threads x vec). Why each rule is what it is: docs/perf-notes.md, items
44 and 55-57."""
from __future__ import annotations

import torch

from impls.base import dtype_name
from impls.gpu_limits import SM_REGISTERS, SM_SHARED, SM_THREADS
from impls.tilelang._plan_type import Plan, max_vec

CLUSTER_VARIANTS = ("cluster", "layer_norm_cluster")  # RMSNorm, LayerNorm
# Portable cluster size on sm_90: the smallest cluster up to this whose segments hold at most
# SEGMENT_BYTES of x (several blocks an SM); at MAX_CLUSTER a segment may be larger.
MAX_CLUSTER = 8
SEGMENT_BYTES = 32768
# Beyond MAX_CLUSTER, clusters of up to WIDE_CLUSTER (a non-portable size, which TileLang launches)
# while a segment would hold more than WIDE_SEGMENT_BYTES: float32 beyond N = 131072, where 8
# blocks of 128 KB left one block an SM. Faster there (two blocks an SM); at 64 KB segments and
# below more blocks were slower (docs/perf-notes.md, item 57).
WIDE_CLUSTER, WIDE_SEGMENT_BYTES = 16, 65536
# 256 threads while a segment is at most VECTORS 16-byte vectors a thread, 512 beyond (512
# threads were slower at 8 vectors, faster at 16: docs/perf-notes.md, item 44).
THREADS, VECTORS = 256, 8
# The launch bound never leaves ptxas fewer registers a thread than this for each row a block carries.
MIN_REGISTERS = 64
# RMSNorm's rows a block from N = ROWS_MIN_N where a row's segment takes THREADS threads: the
# block's threads carry both rows, one weight load serves them, and the launch bound leaves
# 2 x MIN_REGISTERS a thread (two blocks an SM). Faster than one row for RMSNorm, slower for
# LayerNorm and at three blocks an SM (docs/perf-notes.md, item 55).
RMS_ROWS, ROWS_MIN_N = 2, 65536
# The exchange of partials (Plan.mbar_exchange, Plan.relaxed_arrive): by st.async completing on
# each peer's mbarrier, with the one cluster barrier's arrive relaxed after the mbarrier's
# initialisation fence; faster than the exchange by a cluster barrier at every shape measured,
# either change alone mostly slower (docs/perf-notes.md, item 56). A row of one block (cluster_dims
# 1) keeps the barrier exchange: the mbarrier form faulted there on the H200 (illegal instruction
# at 16-bit N = 16384, item 56).
MBAR_EXCHANGE = RELAXED_ARRIVE = True
# LayerNorm's statistics summed from registers as each chunk goes into shared memory
# (Plan.stats_in_load), where a row spans blocks: two passes over shared memory fewer. Faster at
# 8 of 9 shapes on the mbarrier exchange (kept as one rule); RMSNorm's one pass gained nothing
# (docs/perf-notes.md, item 56).
LN_STATS_IN_LOAD = True
# Block sums by warp shuffles and one barrier (Plan.one_barrier_sum) where a row spans blocks,
# instead of TileLang's AllReduce (two named barriers a round, log2(threads / 32) rounds), with
# the mbarrier exchange's partials put from registers: faster at 15 of 18 shapes
# (docs/perf-notes.md, item 57).
ONE_BARRIER_SUM = True
# The longest row compiled (offline builds, spill-free) and measured, in every dtype.
LONGEST_BUILT = 262144


def cluster_size(plan: Plan) -> int:
    return -(-plan.n // plan.padded)


def launch_bound(n: int, seg: int, block_bytes: int, threads: int, rows: int) -> int | None:
    """Blocks an SM for a block of ``threads`` threads carrying ``rows`` rows in ``block_bytes``
    of shared memory: as many as shared memory holds, while that leaves ptxas MIN_REGISTERS per
    thread and row (unbounded, ptxas keeps every vector of the segment's load in flight in
    registers: 87 at bf16 262144, 256 threads, two blocks an SM where three fit). None for a row
    of one block (segments of ``seg`` columns): at 64 registers its LayerNorm spills (bf16 16384
    with bias: 4 bytes), and such rows are the row-per-block kernels' anyway."""
    fit = min(SM_SHARED // (block_bytes + 1024), SM_THREADS // threads,
              SM_REGISTERS // (threads * MIN_REGISTERS * rows))
    return fit if fit > 1 and -(-n // seg) > 1 else None


def cluster_plan(variant: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
                 threads: int | None = None, segment_bytes: int | None = None,
                 max_cluster: int | None = None, rows: int | None = None) -> Plan:
    """The fewest blocks per row (a power of two, at most ``max_cluster``, default MAX_CLUSTER)
    whose segments hold at most ``segment_bytes`` (default SEGMENT_BYTES) of x, each segment a
    multiple of threads x 16 bytes of columns; ``threads`` (default by VECTORS) and ``rows``, the
    rows a block carries (its threads work on each; a segment of each in shared memory; default
    RMS_ROWS for RMSNorm from ROWS_MIN_N at THREADS threads, else one). The overrides are for the
    probe's candidates (impls.tilelang.candidates). The launch bound: launch_bound."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    size = getattr(torch, dt).itemsize
    most = segment_bytes or SEGMENT_BYTES
    max_cluster = max_cluster or MAX_CLUSTER
    c = 1
    while c < max_cluster and -(-n // c) * size > most:
        c *= 2
    while c < WIDE_CLUSTER and -(-n // c) * size > WIDE_SEGMENT_BYTES:
        c *= 2
    tpr = threads or (THREADS if -(-n // c) * size <= THREADS * 16 * VECTORS else 2 * THREADS)
    if rows is None:
        rows = RMS_ROWS if variant == "cluster" and n >= ROWS_MIN_N and tpr == THREADS else 1
    unit = tpr * max_vec(getattr(torch, dt))
    seg = -(-(-(-n // c)) // unit) * unit
    bound = launch_bound(n, seg, rows * seg * size, tpr, rows)
    return Plan(variant, dt, n, has_weight, has_bias, vec, tpr, rows, seg, bound, rows_share_threads=True,
                mbar_exchange=MBAR_EXCHANGE and c > 1, relaxed_arrive=RELAXED_ARRIVE and c > 1,
                stats_in_load=LN_STATS_IN_LOAD and c > 1 and variant == "layer_norm_cluster",
                one_barrier_sum=ONE_BARRIER_SUM and c > 1)
