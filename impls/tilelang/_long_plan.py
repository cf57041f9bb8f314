"""Plans of the long-row cluster kernels (_long_programs): one row over a thread-block cluster of
CLUSTER blocks, each holding its segment of the row in shared memory. Plain Python: no tilelang
import.

The cluster size is not a Plan field: it is ceil(N / plan.padded), plan.padded being one block's
segment (a multiple of threads x vec)."""
from __future__ import annotations

import torch

from impls.base import dtype_name
from impls.gpu_limits import SM_REGISTERS, SM_SHARED, SM_THREADS
from impls.tilelang.plan import Plan, max_vec

CLUSTER_VARIANTS = ("cluster", "layer_norm_cluster")  # RMSNorm, LayerNorm
# The suffix of the variants whose segment is loaded by the tensor memory accelerator (TMA).
TMA = "_tma"
# Portable cluster size on sm_90: the smallest cluster up to this whose segments hold at most
# SEGMENT_BYTES of x (several blocks an SM); at MAX_CLUSTER a segment may be larger.
MAX_CLUSTER = 8
SEGMENT_BYTES = 32768
# Beyond MAX_CLUSTER, clusters of up to WIDE_CLUSTER (a non-portable size, which TileLang launches)
# while a segment would hold more than WIDE_SEGMENT_BYTES: float32 beyond N = 131072, where 8
# blocks of 128 KB left one block an SM. Measured (tools/long_row_probe.py at c41385e, with
# Plan.one_barrier_sum, docs/perf-notes.md item 57): float32 262144 at 16 blocks of 64 KB (two an
# SM) RMSNorm 89.2% of copy against 85.2%, LayerNorm 78.0 against 77.9; at 64 KB segments and
# below (16-bit 262144: 89.9 against 93.4%) more blocks were slower.
WIDE_CLUSTER, WIDE_SEGMENT_BYTES = 16, 65536
# 256 threads while a segment is at most VECTORS 16-byte vectors a thread, 512 beyond (measured,
# tools/long_row_probe.py at 2bfae55: 512 threads 20 points slower at 8 vectors, 3-9 faster at 16).
THREADS, VECTORS = 256, 8
# The launch bound never leaves ptxas fewer registers a thread than this for each row a block carries.
MIN_REGISTERS = 64
# RMSNorm's rows a block from N = ROWS_MIN_N where a row's segment takes THREADS threads: the
# block's threads carry both rows, one weight load serves them, and the launch bound leaves
# 2 x MIN_REGISTERS a thread (two blocks an SM). Measured (tools/long_row_probe.py at 725bf38 and
# 53ab279, docs/perf-notes.md item 55): 1.5-3 points over one row at 16-bit 65536, fp16 131072
# and float32 65536, level at bf16 131072; at three blocks an SM (80 registers) slower, and
# LayerNorm slower either way.
RMS_ROWS, ROWS_MIN_N = 2, 65536
# The exchange of partials (Plan.mbar_exchange, Plan.relaxed_arrive): by st.async completing on
# each peer's mbarrier, with the one cluster barrier's arrive relaxed after the mbarrier's
# initialisation fence. Measured (tools/long_row_probe.py at dfc0b9d, 2026-12-04, docs/perf-notes.md
# item 56): 2.3-10.5 points over the exchange by a cluster barrier after the remote stores at all
# 18 shapes (N = 65536-262144, both ops, three dtypes); either change alone was mostly slower.
# A row of one block (cluster_dims 1) keeps the barrier exchange: the mbarrier form faulted there
# on the H200 (illegal instruction at 16-bit N = 16384, ff2ea98's checks).
MBAR_EXCHANGE = RELAXED_ARRIVE = True
# LayerNorm's statistics summed from registers as each chunk goes into shared memory
# (Plan.stats_in_load), where a row spans blocks: two passes over shared memory fewer. Measured
# on the mbarrier exchange (probe and benchmark at 5cdceca, item 56): +1.5 to +3.8 points at 8 of
# 9 shapes, -0.5 / -0.9 at bf16 262144 (kept: one rule); RMSNorm's one pass gained nothing.
LN_STATS_IN_LOAD = True
# Block sums by warp shuffles and one barrier (Plan.one_barrier_sum) where a row spans blocks,
# instead of TileLang's AllReduce (two named barriers a round, log2(threads / 32) rounds), with
# the mbarrier exchange's partials put from registers. Measured (tools/long_row_probe.py at
# c41385e, 2026-12-05, docs/perf-notes.md item 57), % of copy against the AllReduce at N 65536 /
# 131072 / 262144: RMSNorm +1.0 to +2.5 (16-bit) and +1.0 to +5.1 (float32) but at fp16 262144
# (level); LayerNorm fp16 +2.8 / +2.6 / +1.1, float32 +1.8 / +2.0 / +3.0, bf16 -0.5 / -0.9 / +1.8.
ONE_BARRIER_SUM = True
# Waves ahead whose segment each block brings into L2 before its loads (Plan.l2_ahead), where a row
# spans blocks. Built after 29bbf56 and not measured yet (tools/long_row_probe.py's 'L2 ahead'
# labels): 0 (none) until a probe says otherwise.
L2_AHEAD = 0
# LayerNorm's rows a cluster normalises one after another, its blocks keeping their weight and bias
# segments in shared memory (Plan.seq_rows; 0: one row a cluster), with segments of at most
# SEQ_SEGMENT_BYTES in clusters of up to WIDE_CLUSTER (three segments a block in shared memory).
# Built after 29bbf56 and not measured yet (tools/long_row_probe.py's 'rows in turn' labels):
# 0 until a probe says otherwise.
LN_SEQ_ROWS, SEQ_SEGMENT_BYTES = 0, 16384
# The longest row compiled (offline builds, spill-free) and measured, in every dtype.
LONGEST_BUILT = 262144


def cluster_size(plan: Plan) -> int:
    return -(-plan.n // plan.padded)


def cluster_plan(variant: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
                 threads: int | None = None, segment_bytes: int | None = None,
                 max_cluster: int | None = None, rows: int | None = None, seq_rows: int | None = None) -> Plan:
    """The fewest blocks per row (a power of two, at most ``max_cluster``) whose segments hold at
    most ``segment_bytes`` (default SEGMENT_BYTES) of x, each segment a multiple of threads x 16
    bytes of columns (LayerNorm with LN_SEQ_ROWS: SEQ_SEGMENT_BYTES and WIDE_CLUSTER); the
    overrides are for tools/long_row_probe. ``rows``: rows a block carries
    (its threads work on each; a segment of each in shared memory; default RMS_ROWS for RMSNorm
    from ROWS_MIN_N at THREADS threads, else one). The launch bound is as many blocks as shared
    memory holds (with ``seq_rows``, Plan.seq_rows, default LN_SEQ_ROWS for LayerNorm where a row
    spans blocks, the weight and bias segments there too), while
    that leaves ptxas MIN_REGISTERS per thread and row: unbounded,
    ptxas keeps every vector of the segment's load in flight in registers (87 at bf16 262144,
    256 threads: two blocks an SM where three fit)."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    size = getattr(torch, dt).itemsize
    seq_rule = seq_rows is None and variant == "layer_norm_cluster" and LN_SEQ_ROWS > 0
    most = segment_bytes or (SEQ_SEGMENT_BYTES if seq_rule else SEGMENT_BYTES)
    max_cluster = max_cluster or (WIDE_CLUSTER if seq_rule else MAX_CLUSTER)
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
    if seq_rows is None:
        seq_rows = LN_SEQ_ROWS if seq_rule and -(-n // seg) > 1 else 0
    held = 2 * seg * size if seq_rows else 0  # the weight and bias segments a block keeps
    fit = min(SM_SHARED // (rows * seg * size + held + 1024), SM_THREADS // tpr,
              SM_REGISTERS // (tpr * MIN_REGISTERS * rows))
    # A row of one block (no cluster) takes no bound: at 64 registers its LayerNorm spills (bf16
    # 16384 with bias: 4 bytes), and such rows are the row-per-block kernels' anyway.
    bound = fit if fit > 1 and -(-n // seg) > 1 else None
    return Plan(variant, dt, n, has_weight, has_bias, vec, tpr, rows, seg, bound, rows_share_threads=True,
                mbar_exchange=MBAR_EXCHANGE and c > 1, relaxed_arrive=RELAXED_ARRIVE and c > 1,
                stats_in_load=LN_STATS_IN_LOAD and c > 1 and variant == "layer_norm_cluster",
                one_barrier_sum=ONE_BARRIER_SUM and c > 1, l2_ahead=L2_AHEAD if c > 1 else 0, seq_rows=seq_rows)
