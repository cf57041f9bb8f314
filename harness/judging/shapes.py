"""Every row length N and row count M the harness runs, in one place: the check catalogue's
(harness.judging.cases), the benchmark sweep's (harness.bench) and the speed targets'
(harness.report.targets, harness.report.host)."""
from __future__ import annotations

# -- checks -----------------------------------------------------------------------------------
# Row lengths that are not multiples of any block or vector width, and every power of two.
ODD_N = (1, 7, 127, 129, 769, 1000, 1536, 3000, 4000, 4097, 5120, 12345)
POW2_N = tuple(2**k for k in range(17))  # 1 .. 65536
CHECK_LONG_N = (65537, 100000, 131072, 262143, 262144)  # beyond one block: for kernels that claim it
CHECK_LONG_N_QUICK = (65537, 100000)
# Beyond 2**31 elements (the full profile: a GPU): 64-bit offsets, in every kernel (N = 4096) and in
# the long-row ones; (shape, dtypes). Judged in row chunks (harness.judging.runner.ChunkedReference), one
# such case at a time (harness.running.scheduling), no determinism check (two calls' outputs and their bit
# comparison would take tens of GB).
HUGE_ELEMENTS = 2**31
HUGE_CASES = (((524289, 4096), ("bfloat16", "float32")), ((16385, 131072), ("bfloat16",)))
TAIL_M = (1, 3, 17, 1025)  # row counts that are not multiples of any rows-per-program
TAIL_M_FULL = (4096, 16384)  # added in the full profile
# The backward catalogue: M tails of the dw/db reductions over rows, one beyond 65536 rows (full),
# and N odd or padded for the row sums of dx.
# 65 = 2 x 32 + 1 leaves a tail for any row block up to 64; the CPU's profile stops there (each
# interpreted backward of 1025 rows took 5-7 s in CI), the full one adds the longer tails.
BACKWARD_TAIL_M = (1, 3, 17, 65)
BACKWARD_TAIL_M_FULL = (1025, 4097)
BACKWARD_LARGE_M = 65537
BACKWARD_N = (1, 7, 127, 1000, 4097)
BACKWARD_N_FULL = (769, 4000, 4096, 8192, 12345)

# Batch invariance (harness.judging.properties): rows of an M x N case recomputed in smaller batches.
BATCH_N = (1000, 1024, 4096, 8192, 65536)
BATCH_N_QUICK = (1000,)
BATCH_M, BATCH_M_QUICK = 4096, 256
# Determinism on the CPU: one catalogue case in this many, of at most so many elements (the full
# profile: every case).
DETERMINISM_EVERY_QUICK = 3
DETERMINISM_MAX_ELEMENTS_QUICK = 2**16

# -- benchmarks -------------------------------------------------------------------------------
# Bandwidth regime: M x N >= BANDWIDTH_ELEMENTS (M >= 16384), N up to 65536 for every kernel and
# BENCH_LONG_N beyond it for those without a limit; decode regime: a few rows.
BANDWIDTH_ELEMENTS = 2**26
BANDWIDTH_N = (1024, 2048, 4000, 4096, 5120, 8192, 12288, 16384, 32768, 65536)
BENCH_LONG_N = (131072, 262144)
DECODE_M = (1, 8, 64)
DECODE_N = (4096, 8192)
QUICK_BANDWIDTH = ((512, 1024), (128, 4000))  # (M, N) on the CPU and in CI: seconds, not minutes
QUICK_DECODE = ((8, 4096),)
# Backward regime: the row lengths of the backward targets, M as in the bandwidth regime.
BACKWARD_BENCH_N = (1024, 2048, 4096, 8192)
QUICK_BACKWARD = ((256, 1024),)
# The headline set: what a plain `pytest --benchmark-only` times on a GPU (minutes, every regime:
# bandwidth at a short, a padded and a long N, the host columns at N 1024 and decode, long rows,
# decode, backward); `--bench-set full` the whole sweep above. Without --dtype: HEADLINE_DTYPES.
HEADLINE_BANDWIDTH_N = (1024, 4000, 8192)
HEADLINE_LONG_N = (131072,)
HEADLINE_DECODE = ((1, 4096), (64, 4096))
HEADLINE_BACKWARD_N = (4096,)
HEADLINE_DTYPES = ("bfloat16",)


def bandwidth_rows(n: int) -> int:
    """M of the bandwidth regime at N: M x N >= BANDWIDTH_ELEMENTS, also where N does not divide it."""
    return max(16384, -(-BANDWIDTH_ELEMENTS // n))


# -- speed targets (harness.report.targets, harness.report.host) -----------------------------
TARGET_MID_N = (4000, 4096, 5120, 8192, 12288, 16384, 32768)
TARGET_SHORT_N = (1024, 2048)  # at M >= TARGET_SHORT_MIN_M
TARGET_SHORT_MIN_M = 32768
TARGET_LONG_N = (65536, 131072, 262144)  # issue 23: best >= 90%, each project backend >= 85%
BACKWARD_TARGET_N = BACKWARD_BENCH_N  # bfloat16: every N the backward regime times
HOST_BANDWIDTH_N = (1024, 2048)  # the bandwidth shapes whose host cost is judged (besides decode's)
