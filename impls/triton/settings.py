"""Launch settings of the Triton kernels, from (op, N, dtype, M): the tuned tables of
tuned_h200.toml where a sweep measured the shape, else the rules below; the variant the dispatch
functions run; and the backward's settings (backward_config, from op, N and dtype). Plain Python:
no triton import. Public, for the sweep tools and tests.

Why each rule and table row is what it is: docs/perf-notes.md (tools/triton_sweep.py measures).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from impls import tuned
from impls.gpu_limits import cdiv, next_pow2

TUNED_FILE = Path(__file__).with_name("tuned_h200.toml")

# Largest N the rowwise kernels hold in one tile; the looped ones take any N.
ROWWISE_MAX_N = 65536
# Rowwise rule: a [ROWS, BLOCK_N] tile of about TILE_ELEMS float32 accumulators (16 KiB), at most
# MAX_ROWS rows (tiny N still leaves several programs for moderate M), PER_THREAD float32 values
# per thread, at most MAX_WARPS warps (1024 threads).
TILE_ELEMS = 4096
MAX_ROWS = 64
PER_THREAD = 16
MAX_WARPS = 32
# Looped rule: chunks of at most LOOPED_MAX_BLOCK elements, LOOPED_PER_THREAD float32 values per
# thread (one 16-byte load of 16-bit x), twice that for float32 LayerNorm.
LOOPED_MAX_BLOCK = 8192
LOOPED_PER_THREAD = 8
# Decode rule: rowwise with at most DECODE_MAX_ROWS rows (the grid cannot fill an H200's 132
# SMs) of at least DECODE_MIN_BLOCK columns: one row per program, DECODE_PER_THREAD values per
# thread, weight and bias loaded with x.
DECODE_MAX_ROWS = 128
DECODE_MIN_BLOCK = 1024
DECODE_PER_THREAD = 16
# Split kernels (a row over SPLITS programs, x read once): at most SPLIT_MAX programs per row
# (all resident at once, so within the SM count), each holding at most SPLIT_MAX_BLOCK columns,
# SPLIT_PER_THREAD float32 values per thread.
SPLIT_MAX = 64
SPLIT_MAX_BLOCK = 16384
SPLIT_PER_THREAD = 32
# Rows this long run the lagged split kernels (measured faster at N 65536-262144 in every dtype,
# docs/perf-notes.md, item 44; 32769-65535 not timed).
SPLIT_LAG_MIN_N = 32769
# Few rows: the dispatch runs rowwise (with the decode rule) up to this N.
DISPATCH_DECODE_MAX_N = 8192

# The tuned tables (tuned_h200.toml): (op, bytes per element, key) -> setting.
# rowwise: by tile width -> (rows per program, warps).
ROWWISE_TUNED = tuned.table(TUNED_FILE, "rowwise", ("op", "bytes", "block_n"), ("rows", "warps"))
# rowwise at one row per program runs the 1-D kernel (rms_norm_row, layer_norm_row) at these N.
ROWWISE_ONE_ROW = set(tuned.table(TUNED_FILE, "rowwise_one_row", ("op", "bytes", "n"), "n"))
# looped: by N (by tile width for a row of one 1024-wide tile) -> (chunk width, rows, warps);
# float16 rows, keyed (op, N), come first for float16.
LOOPED_TUNED = tuned.table(TUNED_FILE, "looped", ("op", "bytes", "n"), ("block_n", "rows", "warps"), dtype=None)
LOOPED_TUNED_FLOAT16 = tuned.table(TUNED_FILE, "looped", ("op", "n"), ("block_n", "rows", "warps"), dtype="float16")
# looped: a cap on registers per thread for ptxas (compiled kernels only).
LOOPED_MAXNREG = tuned.table(TUNED_FILE, "looped_maxnreg", ("op", "bytes", "n"), "maxnreg")
# The lagged kernels load x past L1 (".cg") and mark the weight and bias to stay there
# ("evict_last"): every row of a program reads the same columns of them again, and x streaming
# through L1 evicted them (docs/perf-notes.md item 53: up to 6.5 points at 65536-262144).
SPLIT_X_CACHE, SPLIT_W_EVICT = ".cg", "evict_last"
# By op: whether the lagged kernels issue row i + 1's load before row i's reductions, in flight
# across them, or after (docs/perf-notes.md item 54: behind LayerNorm's two reductions it gained
# 0.4-13 points in three probes; behind RMSNorm's one, at the same registers, it moved within the
# probes' noise).
SPLIT_NEXT_FIRST = {"rms_norm": False, "layer_norm": True}
# split: by N -> the launch setting: columns per program, warps, and the lagged kernels' load
# choices (the weight held in registers, x's cache modifier, the weight's L1 eviction hint, the
# next row first; the defaults above where a row leaves them out). Built below LaunchConfig.


def _dispatch_ranges() -> dict:
    """(op, bytes per element) -> ((up to N, variant), ...) in order, the last open-ended (None)."""
    ranges: dict = {}
    for row in tuned.load(TUNED_FILE)["dispatch"]:
        ranges.setdefault((row["op"], row["bytes"]), []).append((row["up_to"] or None, row["variant"]))
    return {k: tuple(v) for k, v in ranges.items()}


# The variant the dispatch functions (impls.triton.rms_norm / layer_norm) run, by N.
DISPATCH = _dispatch_ranges()


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int  # columns per tile: the whole row (rowwise) or one chunk (looped)
    rows: int  # rows per program
    num_warps: int
    w_first: bool = False  # rowwise: load weight and bias with x (a latency-bound grid)
    maxnreg: int | None = None  # a cap on registers per thread for ptxas (compiled kernels only)
    one_row: bool = False  # rowwise, one row per program: the 1-D kernel (rms_norm_row, layer_norm_row)
    # The lagged split kernels (docs/perf-notes.md items 52-53): the weight held in registers
    # across a program's rows; x loaded with this cache modifier (".cg": past L1, which then keeps
    # the weight and bias every row reads again); the weight's and bias's L1 eviction hint.
    hold_w: bool = False
    x_cache: str = ""
    w_evict: str = ""
    # ... and the next row's load issued before this row's reductions, not after them.
    next_first: bool = False


SPLIT_TUNED = {key: LaunchConfig(block_n=block_n, rows=1, num_warps=warps, hold_w=hold_w, x_cache=x_cache,
                                 w_evict=w_evict,
                                 next_first=SPLIT_NEXT_FIRST[key[0]] if next_first is None else next_first)
               for key, (block_n, warps, hold_w, x_cache, w_evict, next_first) in tuned.table(
                   TUNED_FILE, "split", ("op", "bytes", "n"), ("block_n", "warps"),
                   optional={"hold_w": False, "x_cache": SPLIT_X_CACHE, "w_evict": SPLIT_W_EVICT,
                             "next_first": None}).items()}


def launch_config(n: int, dtype: torch.dtype, looped: bool, op: str = "rms_norm", m: int | None = None) -> LaunchConfig:
    """Launch settings from (op, N, dtype) and the row count M; no autotuning.

    From the tables where the sweep measured that shape class (ROWWISE_TUNED by tile width,
    LOOPED_TUNED by N, LOOPED_TUNED_FLOAT16 before it for float16); otherwise by rule:

    - rowwise: the tile is the row padded to a power of two; rows = TILE_ELEMS // BLOCK_N in
      [1, MAX_ROWS] (short rows share a program: fuller programs on the GPU, and far fewer
      Python steps in the interpreter); warps for PER_THREAD values per thread.
    - looped: one row per program, chunks of ``looped_block`` columns, LOOPED_PER_THREAD values
      per thread. Rows that fit one 1024-wide tile are run as rowwise would run them.
    - rowwise with at most DECODE_MAX_ROWS rows of DECODE_MIN_BLOCK or more (decode): the grid
      cannot fill the GPU, so time is latency: one row per program, DECODE_PER_THREAD values per
      thread, weight and bias loaded with x.
    """
    block_n = next_pow2(n)
    if not looped and m is not None and m <= DECODE_MAX_ROWS and block_n >= DECODE_MIN_BLOCK:
        return LaunchConfig(block_n=block_n, rows=1, num_warps=_warps(block_n // (32 * DECODE_PER_THREAD)),
                            w_first=True, one_row=True)
    if looped:
        key = n if block_n > 1024 else block_n  # a one-tile row: by tile width, as ROWWISE_TUNED
        setting = (LOOPED_TUNED_FLOAT16.get((op, key)) if dtype == torch.float16 else None) or \
            LOOPED_TUNED.get((op, dtype.itemsize, key))
        cap = LOOPED_MAXNREG.get((op, dtype.itemsize, n))
        if setting:
            return LaunchConfig(*setting, maxnreg=cap)
        if block_n > 1024:
            block_n = looped_block(n, dtype.itemsize)
            per_thread = 2 * LOOPED_PER_THREAD if op == "layer_norm" and dtype.itemsize == 4 else LOOPED_PER_THREAD
            return LaunchConfig(block_n=block_n, rows=1, num_warps=_warps(block_n // (32 * per_thread)), maxnreg=cap)
    setting = ROWWISE_TUNED.get((op, dtype.itemsize, block_n))
    if setting:
        rows, warps = setting
    else:
        rows = max(1, min(MAX_ROWS, TILE_ELEMS // block_n))
        warps = _warps(rows * block_n // (32 * PER_THREAD))
    one_row = not looped and rows == 1 and (op, dtype.itemsize, n) in ROWWISE_ONE_ROW
    return LaunchConfig(block_n=block_n, rows=rows, num_warps=warps, one_row=one_row)


def split_config(n: int, dtype: torch.dtype, op: str) -> LaunchConfig:
    """Columns per program and warps of the split kernels: from SPLIT_TUNED, else the widest
    power of two up to 4096 (8192 for float32) that covers N with under 1/16 of padding
    (5120 -> 5 x 1024), widened while the row would need more than SPLIT_MAX programs."""
    setting = SPLIT_TUNED.get((op, dtype.itemsize, n))
    if setting:
        return setting
    block_n = max(64, min(4096 if dtype.itemsize <= 2 else 8192, next_pow2(n)))  # 64: two full warps
    while block_n > 1024 and cdiv(n, block_n) * block_n - n > n // 16:
        block_n //= 2
    while cdiv(n, block_n) > SPLIT_MAX:
        block_n *= 2
    # At least 2 warps: Triton 3.6 failed to compile 1-2 warps at 32-64 programs a row, and 1
    # warp never measured fastest.
    return LaunchConfig(block_n=block_n, rows=1, num_warps=max(2, _warps(block_n // (32 * SPLIT_PER_THREAD))),
                        x_cache=SPLIT_X_CACHE, w_evict=SPLIT_W_EVICT, next_first=SPLIT_NEXT_FIRST[op])


def _warps(w: int) -> int:
    """A power of two in [1, MAX_WARPS], rounded down."""
    return min(MAX_WARPS, 1 << (max(1, w).bit_length() - 1))


def looped_block(n: int, itemsize: int) -> int:
    """Chunk width of the looped kernels where LOOPED_TUNED is silent: for 16-bit x about a
    quarter of the row (8192 -> 2048, 16384 -> 4096), for float32 x the widest chunk; both within
    [1024, LOOPED_MAX_BLOCK], then narrowed until the chunks cover N with under 1/16 of padding
    (float32 12288 -> 4096 x 3): masked lanes load nothing but still hold threads."""
    target = n // 4 if itemsize <= 2 else next_pow2(n)
    block_n = max(1024, min(LOOPED_MAX_BLOCK, 1 << max(0, target.bit_length() - 1)))
    while block_n > 1024 and cdiv(n, block_n) * block_n - n > n // 16:
        block_n //= 2
    return block_n


def choose_variant(op: str, n: int, dtype: torch.dtype, m: int | None = None, split_runs: bool = True) -> str:
    """The Triton variant the dispatch functions run for M rows of N elements of ``dtype``:
    rowwise for few rows, else DISPATCH; "split" becomes looped where it cannot run
    (``split_runs`` false) or the row is too long for it."""
    if m is not None and m <= DECODE_MAX_ROWS and n <= DISPATCH_DECODE_MAX_N:
        return "rowwise"
    ranges = DISPATCH[(op, 2 if dtype.itemsize <= 2 else 4)]
    variant = next(v for most, v in ranges if most is None or n <= most)
    if variant == "split" and (n > SPLIT_MAX * SPLIT_MAX_BLOCK or not split_runs):
        return "looped"
    return variant  # DISPATCH's rowwise ranges end within ROWWISE_MAX_N (tests hold it to that)


# -- The backward (backward.py) -----------------------------------------------------------------
# From op, N and dtype only, never M: the rows of a dw/db partial (and so the reduction tree)
# never move with M. The rule: at least BWD_BLOCK_M rows per program; tiles of about
# BWD_TILE_ELEMS values, at most BWD_PER_THREAD float32 values per thread and at most
# BWD_MAX_WARPS warps.
BWD_BLOCK_M = 64
BWD_TILE_ELEMS = 4096
BWD_PER_THREAD = 8
BWD_MAX_WARPS = 16
# Rows of up to this many columns (padded to a power of two) are one tile: c1, c2 in the row kernel.
BWD_ONE_TILE_MAX = 8192
# Longer rows: column blocks of this width, after a pass that writes c1, c2 per row; rows per
# program for them.
BWD_COL_BLOCK = 1024
BWD_LONG_BLOCK_M = 32
# The final reduction: narrow column blocks (REDUCE_PROGRAMS of them where N allows, between
# REDUCE_MIN_N and REDUCE_MAX_N columns), REDUCE_TILE partial values per step.
REDUCE_PROGRAMS, REDUCE_MIN_N, REDUCE_MAX_N, REDUCE_TILE, REDUCE_WARPS = 128, 16, 256, 8192, 8
# The tuned table (tuned_h200.toml's backward rows): (op, bytes per element, tile width) ->
# (rows per program, rows per tile, warps, maxnreg (0: none), stages (0: the next tile in registers)).
BWD_SETTINGS = tuned.table(TUNED_FILE, "backward", ("op", "bytes", "block_n"), ("block_m", "rows", "warps"),
                           optional={"maxnreg": 0, "stages": 0})


@dataclass(frozen=True)
class BackwardConfig:
    block_n: int  # columns per tile
    rows: int  # rows per tile (a divisor of block_m)
    num_warps: int
    one_tile: bool  # block_n covers N
    block_m: int = BWD_BLOCK_M  # rows per program: one dw/db partial
    reduce_n: int = 64  # the reduction's columns per program
    reduce_parts: int = 64  # the reduction's partial rows per step
    maxnreg: int | None = None  # a cap on the row kernel's registers per thread (compiled only)
    stages: int = 0  # tiles ahead: 0 one, in registers; >= 2 stages - 1, by Triton's pipeliner (bwd_rows)


def backward_config(n: int, dtype: torch.dtype, op: str = "rms_norm", one_tile_max: int = BWD_ONE_TILE_MAX,
                    col_block: int = BWD_COL_BLOCK, setting: tuple | None = None) -> BackwardConfig:
    """The backward's launch setting for rows of N in dtype: ``setting`` (rows per program, rows
    per tile, warps[, maxnreg[, stages]]) if given, else BWD_SETTINGS, else the rule."""
    block_n = next_pow2(n)
    one_tile = block_n <= one_tile_max
    if not one_tile:
        block_n = col_block
    reduce_n = min(REDUCE_MAX_N, max(REDUCE_MIN_N, next_pow2(n) // REDUCE_PROGRAMS))
    reduce = dict(reduce_n=reduce_n, reduce_parts=max(1, REDUCE_TILE // reduce_n))
    setting = setting or (BWD_SETTINGS.get((op, dtype.itemsize, block_n)) if one_tile else None)
    if setting:
        block_m, rows, warps, *rest = setting
        if len(rest) > 2:
            raise ValueError(f"a backward setting has 3 to 5 fields, not {len(setting)}: {setting}")
        cap, stages = (list(rest) + [0, 0])[:2]
        if block_m % rows:
            raise ValueError(f"rows per tile ({rows}) must divide rows per program ({block_m})")
        if stages == 1 or stages < 0:
            raise ValueError(f"stages must be 0 (the next tile in registers) or at least 2, not {stages}")
        return BackwardConfig(block_n, rows, warps, one_tile, block_m, **reduce, maxnreg=cap or None,
                              stages=stages)
    rows = max(1, BWD_TILE_ELEMS // block_n)
    block_m = max(BWD_BLOCK_M if one_tile else BWD_LONG_BLOCK_M, rows)
    warps = min(BWD_MAX_WARPS, max(1, next_pow2(max(1, rows * block_n // (32 * BWD_PER_THREAD)))))
    return BackwardConfig(block_n, rows, warps, one_tile, block_m, **reduce)
