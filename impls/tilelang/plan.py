"""Launch plans of the TileLang kernels: threads, rows per block, vector width and padding,
from (variant, dtype, N, affine flags, vector width), and for few rows M (DECODE_TUNED). Plain
Python: no tilelang import.

One plan is one compilation (the key of both caches); M and the row strides are runtime values.
"""
from __future__ import annotations

from pathlib import Path

import torch

from impls import tuned
from impls.base import dtype_name
from impls.gpu_limits import SM_REGISTERS, SM_THREADS, next_pow2
from impls.tilelang._long_plan import CLUSTER_VARIANTS, cluster_plan
from impls.tilelang._plan_type import Plan, max_vec  # noqa: F401  (Plan: part of this interface)

# float32 values of the row each thread may hold in registers (fragment, layer_norm_fwd):
# 64 at 512 threads puts 32768 columns in one block; ptxas for sm_90 keeps that spill-free.
FRAGMENT_MAX_N = 32768
MAX_THREADS = 512
MIN_BLOCK_THREADS = 128  # short rows share a block up to this many threads
# splitk: vectors each thread loads per segment; blk_k = threads x vec x this.
SPLITK_VECTORS = 4
SPLITK_THREADS = 256
NAIVE_THREADS = 256

# layer_norm_fwd: vectors each thread holds (64 bytes of x in any dtype; 2 for N <= 2048, where
# that measured faster), and the register budget per thread its launch bound aims ptxas at, by
# vectors per thread (spill-free at sm_90 in every dtype and N of the sweep).
LN_VECTORS, LN_SHORT_VECTORS, LN_SHORT_N = 4, 2, 2048  # fragment: always 2
LN_REG_BUDGET = ((2, 40), (4, 64))
# float32 keeps 8 vectors (32 values) per thread in 64 registers; 16-bit types would spill.
LN_REG_BUDGET_F32 = ((2, 40), (8, 64))

TUNED_FILE = Path(__file__).with_name("tuned_h200.toml")
# Plans measured fastest where they beat the rules above by more than a point, for the widest
# vector only (tuned_h200.toml): (variant, bytes per element, N) -> (threads per row,
# min_blocks; None: the rule's bound). What wins at non-power-of-two N is a thread count that
# divides the row with no padded vectors (5120 = 128 threads x 5 vectors of 8) and a launch bound
# near 85 registers per thread.
TUNED = {k: (tpr, mb or None) for k, (tpr, mb) in
         tuned.table(TUNED_FILE, "bandwidth", ("variant", "bytes", "n"), ("threads_per_row", "min_blocks")).items()}

# Few rows (decode, M <= DECODE_MAX_ROWS): the grid cannot fill the GPU, time is latency, and the
# bandwidth plans above can be slow there. Threads per row where they beat the bandwidth plan
# (tuned_h200.toml); the launch bound is the rule's. A decode plan is a second compilation for
# that N.
DECODE_MAX_ROWS = 128
DECODE_TUNED = tuned.table(TUNED_FILE, "decode", ("variant", "bytes", "n"), "threads_per_row")
# The programs with a PDL form (Plan.pdl): the row read once, its weight and bias loaded with it.
# layer_norm_fwd's rows beyond FRAGMENT_MAX_N take layer_norm_long, which has none.
PDL_VARIANTS = ("fragment", "layer_norm_fwd")
THREAD_REGISTERS = 255  # the most a thread may have


def choose_vec(dtype: torch.dtype, n: int, strides: tuple[int, ...] = (), offsets: tuple[int, ...] = ()) -> int:
    """Widest vector (in elements) that divides N, every row stride and every pointer offset
    (in elements from a 16-byte boundary): then every vector access is aligned."""
    vec = max_vec(dtype)
    while vec > 1 and (n % vec or any(s % vec for s in strides) or any(o % vec for o in offsets)):
        vec //= 2
    return vec


def make_plan(variant: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
              threads_per_row: int | None = None, min_blocks: int | None = None, m: int | None = None) -> Plan:
    """The plan the kernels run for M rows (None: many): DECODE_TUNED's for few rows, else TUNED's
    where it has one, else the rules below. ``threads_per_row`` and ``min_blocks`` override all
    (fragment and layer_norm_fwd only), for tools/tilelang_sweep.py."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    if variant == "naive_row_per_block":
        # Scalar accesses; one row per block.
        return Plan(variant, dt, n, has_weight, has_bias, 1, NAIVE_THREADS, 1, NAIVE_THREADS)
    if variant == "splitk" or (variant == "layer_norm_fwd" and n > FRAGMENT_MAX_N):
        # layer_norm_fwd's rows beyond the register capacity take its two-pass program, in
        # splitk's segments (_programs.layer_norm_long).
        variant = "layer_norm_long" if variant == "layer_norm_fwd" else variant
        tpr = SPLITK_THREADS
        seg = tpr * vec * SPLITK_VECTORS
        # Short rows need not pay for a segment much longer than the row.
        while seg // 2 >= n and seg // 2 >= tpr * vec:
            seg //= 2
        return Plan(variant, dt, n, has_weight, has_bias, vec, tpr, 1, seg)
    if variant in ("fragment", "layer_norm_fwd"):
        dtype = getattr(torch, dt)
        key = (variant, dtype.itemsize, n)
        tuned = None
        if vec == max_vec(dtype) and threads_per_row is None and min_blocks is None:  # the tables: widest vector
            decode = DECODE_TUNED.get(key) if m is not None and m <= DECODE_MAX_ROWS else None
            tuned = (decode, None) if decode else TUNED.get(key)
        if tuned:
            threads_per_row, min_blocks = tuned
        per_thread = LN_VECTORS if variant == "layer_norm_fwd" and n > LN_SHORT_N else LN_SHORT_VECTORS
        vectors = -(-n // vec)
        # About per_thread vectors per thread, 32..512 threads per row.
        tpr = threads_per_row or min(MAX_THREADS, max(32, next_pow2(-(-vectors // per_thread))))
        rows = max(1, MIN_BLOCK_THREADS // tpr)
        padded = -(-n // (tpr * vec)) * (tpr * vec)
        return Plan(variant, dt, n, has_weight, has_bias, vec, tpr, rows, padded, min_blocks)
    if variant in CLUSTER_VARIANTS:
        return cluster_plan(variant, dt, n, has_weight, has_bias, vec)
    raise ValueError(f"unknown tilelang variant {variant!r}")


def pdl_fits(plan: Plan) -> bool:
    """Whether a plan's PDL form fits a thread's registers: it holds the weight and bias (in x's
    dtype) beside the row and its float32 squares, 32-bit words per thread within what a thread
    of the block may have. At sm_90 the forms that fit built spill-free; bfloat16 layer_norm_fwd
    at N = 16384 (128 values a thread) and float32 at 32768 (64 values, 512 threads) spilled."""
    values = plan.padded // plan.threads_per_row
    size = getattr(torch, plan.dtype).itemsize
    words = values * (1 + plan.has_weight + plan.has_bias) * size // 4 + values
    return words <= min(THREAD_REGISTERS, SM_REGISTERS // plan.threads)


def vectors_per_thread(plan: Plan) -> int:
    return plan.padded // (plan.threads_per_row * plan.vec)


def ln_min_blocks_per_sm(plan: Plan) -> int:
    """layer_norm_fwd's ``minBlocksPerMultiprocessor`` (``__launch_bounds__``): as many blocks as
    fit in the register file at LN_REG_BUDGET registers per thread, so ptxas stops at that
    budget instead of the 46..80 registers it takes under a bound of one block (1..4 blocks,
    24..36 KB of x in flight per SM). 1 (no bound) above 4 vectors per thread (8 for float32),
    where the row itself fills the registers (64 would spill 236-312 bytes at bf16/fp16
    N = 32768)."""
    if plan.min_blocks is not None:
        return plan.min_blocks
    vpt = vectors_per_thread(plan)
    table = LN_REG_BUDGET_F32 if plan.dtype == "float32" else LN_REG_BUDGET
    budget = next((regs for most, regs in table if vpt <= most), None)
    if budget is None:
        return 1
    if plan.rows_per_block > 1 and vpt > 2:
        budget += 8  # the two-pass program at 64 registers spills 8-16 bytes with several rows
    return max(1, min(SM_THREADS // plan.threads, SM_REGISTERS // (plan.threads * budget)))
