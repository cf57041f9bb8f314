"""Plans of the long-row cluster kernels (_long_programs): one row over a thread-block cluster of
CLUSTER blocks, each holding its segment of the row in registers. Plain Python: no tilelang import.

The cluster size is not a Plan field: it is ceil(N / plan.padded), plan.padded being one block's
segment (a multiple of threads x vec)."""
from __future__ import annotations

import torch

from impls.base import dtype_name
from impls.gpu_limits import SM_REGISTERS, SM_SHARED, SM_THREADS
from impls.tilelang.plan import Plan, max_vec

CLUSTER_VARIANTS = ("cluster", "layer_norm_cluster")  # RMSNorm, LayerNorm
# The same exchange with each block's segment in shared memory (_long_programs.*_cluster_smem).
SMEM_VARIANTS = ("cluster_smem", "layer_norm_cluster_smem", "layer_norm_cluster_smem1")
SMEM_THREADS = 256
# The smallest cluster whose segments fit this many bytes of x each (more blocks per SM), at most
# MAX_CLUSTER blocks; a segment may be up to SMEM_SEGMENT_MAX (one block per SM).
SMEM_SEGMENT_BYTES = 32768
SMEM_SEGMENT_MAX = 200 * 1024
SMEM_MIN_REGISTERS = 64
SMEM_VECTORS = 8
# Portable cluster size on sm_90 (16 needs a non-portable launch attribute).
MAX_CLUSTER = 8
CLUSTER_THREADS = 512
# 16-byte vectors each thread holds: start here, doubled until the row fits MAX_CLUSTER blocks.
CLUSTER_VECTORS = 4
CLUSTER_MAX_VECTORS = 16  # 64 registers of x per thread in any dtype
# LayerNorm with narrower accesses (N not a multiple of 16 bytes) spills above 4 (bf16 N=262143:
# 56 bytes at 8; 1024 threads, capped at 64 registers, spill more).
LN_NARROW_MAX_VECTORS = 4
# The longest row compiled (offline builds, spill-free) in every dtype; 16-bit rows would fit twice
# as long at 16 vectors per thread, never compiled.
LONGEST_BUILT = 262144


def cluster_max_n(variant: str, dtype: str, vec: int) -> int:
    """The longest row the rule fits in MAX_CLUSTER blocks without spilling."""
    wide = max_vec(getattr(torch, dtype))
    vectors = LN_NARROW_MAX_VECTORS if variant == "layer_norm_cluster" and vec < wide else CLUSTER_MAX_VECTORS
    return min(LONGEST_BUILT, MAX_CLUSTER * CLUSTER_THREADS * vectors * wide)


def cluster_size(plan: Plan) -> int:
    return -(-plan.n // plan.padded)


def cluster_plan(variant: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
                 threads: int | None = None, vectors: int | None = None, bound: bool = True) -> Plan:
    """Threads per block and 16-byte vectors per thread (``threads``/``vectors``/``bound``
    override the rule, for tools/long_row_probe): the fewest blocks per row with CLUSTER_VECTORS
    vectors per thread, more vectors per thread where the row would need more than MAX_CLUSTER
    blocks. At CLUSTER_VECTORS full-width vectors a launch bound of 2 blocks per SM (64
    registers): ptxas otherwise takes 68-96 (RMSNorm bf16 131072, LayerNorm bf16 65536 with
    bias), one block per SM, and spills nothing at 64 where no lane is masked; masked lanes
    spill there (LayerNorm bf16 100000 with bias: 34 bytes)."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    tpr = threads or CLUSTER_THREADS
    # Vectors of the plan's width that make 16 bytes: a narrower vec holds as many bytes.
    per16 = max_vec(getattr(torch, dt)) // vec
    vpt = vectors or CLUSTER_VECTORS
    while vectors is None and -(-n // (tpr * vec * vpt * per16)) > MAX_CLUSTER and vpt < CLUSTER_MAX_VECTORS:
        vpt *= 2
    seg = tpr * vec * vpt * per16
    # Short rows: fewer threads' worth of segment, never past the row (one block, no cluster).
    while seg // 2 >= n and seg // 2 >= tpr * vec:
        seg //= 2
    whole = per16 == 1 and n % seg == 0  # no masked lanes
    min_blocks = 2 if bound and whole and vpt <= CLUSTER_VECTORS and tpr == CLUSTER_THREADS else None
    return Plan(variant, dt, n, has_weight, has_bias, vec, tpr, 1, seg, min_blocks)


def smem_cluster_plan(variant: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
                      threads: int | None = None, segment_bytes: int | None = None,
                      max_cluster: int = MAX_CLUSTER) -> Plan:
    """The shared-memory cluster kernels' plan: the fewest blocks per row (a power of two, at
    most MAX_CLUSTER) whose segments hold at most ``segment_bytes`` of x, each a multiple of
    threads x 16 bytes of columns (``threads``/``segment_bytes`` override the defaults, for
    tools/long_row_probe)."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    size = getattr(torch, dt).itemsize
    most = segment_bytes or SMEM_SEGMENT_BYTES  # (max_cluster 16 needs a non-portable cluster launch)
    c = 1
    while c < max_cluster and -(-n // c) * size > most:
        c *= 2
    # More threads where the segment would be more than SMEM_VECTORS 16-byte vectors per thread.
    tpr = threads or (SMEM_THREADS if -(-n // c) * size <= SMEM_THREADS * 16 * SMEM_VECTORS else 2 * SMEM_THREADS)
    unit = tpr * max_vec(getattr(torch, dt))
    seg = -(-(-(-n // c)) // unit) * unit
    # A launch bound of as many blocks as shared memory holds, while that leaves ptxas at least
    # SMEM_MIN_REGISTERS per thread: ptxas otherwise keeps every vector of the segment's load in
    # flight in registers (87 at bf16 262144, 256 threads: two blocks an SM where three fit).
    fit = min(SM_SHARED // (seg * size + 1024), SM_THREADS // tpr, SM_REGISTERS // (tpr * SMEM_MIN_REGISTERS))
    return Plan(variant, dt, n, has_weight, has_bias, vec, tpr, 1, seg, fit if fit > 1 else None)


def smem_max_n(dtype: str) -> int:
    """The longest row the shared-memory cluster kernels take: MAX_CLUSTER segments of at most
    SMEM_SEGMENT_MAX bytes."""
    return MAX_CLUSTER * (SMEM_SEGMENT_MAX // getattr(torch, dtype).itemsize)
