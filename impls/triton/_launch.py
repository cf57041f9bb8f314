"""What the Triton kernels share: loading triton, the run mode, launch settings and the launch.

triton is imported only on first use (availability, note or a call), and never at import of
the backend, so a process without triton still lists the kernels, each skipped with the reason.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache

import torch

from impls.base import NormKernel, cuda_present

# Largest N the rowwise kernels hold in one tile; the looped ones take any N.
ROWWISE_MAX_N = 65536
# Elements of one [ROWS, BLOCK_N] tile to aim for where the table below is silent: about 16 KiB
# of float32 accumulators.
TILE_ELEMS = 4096
# Cap on rows per program, so tiny N still leaves several programs for moderate M.
MAX_ROWS = 64
# Threads of a program hold this many float32 working values each where the table is silent
# (the compute is float32 whatever x's dtype); 32 warps at most (1024 threads).
PER_THREAD = 16
MAX_WARPS = 32
# Looped kernels: widest chunk (elements), and float32 values per thread in a chunk: 8, one
# 16-byte load of 16-bit x, measured best for RMSNorm at every N of the sweep (16 for float32
# LayerNorm, see launch_config).
LOOPED_MAX_BLOCK = 8192
LOOPED_PER_THREAD = 8
# The decode rule of launch_config: rowwise with at most DECODE_MAX_ROWS rows (H200: 132 SMs)
# of at least DECODE_MIN_BLOCK columns (shorter rows still share programs). Measured
# (reports/h200/triton-sweep-decode.json): loading the weight with x saved 0.1-0.3 us of
# 1.6-3.5 us, and 16 values per thread was best or within 0.1 us of it.
DECODE_MAX_ROWS = 128
DECODE_MIN_BLOCK = 1024
DECODE_PER_THREAD = 16

# Rowwise launch settings measured fastest on an H200 (tools/triton_sweep.py, 2026-11-29,
# reports/h200/triton-sweep.json): (op, bytes per element, tile width) -> (rows per program,
# warps). The fewest warps that still hold the row without spilling win: 16-32 float32 values
# per thread, where the old rule's 16 cost up to 30 points for LayerNorm (two reductions, one
# block per SM). Tile widths not measured fall back to the rule. Measured at f851eaa; LayerNorm
# rowwise again after its pair reduction (a89e413), reports/h200/triton-sweep-layer_norm-rowwise.json:
# bf16 1024, 2048 and 4096 changed (93.6 -> 97.1, 93.2 -> 95.3, 93.7 -> 94.8 % of copy). LayerNorm
# rowwise at 1024-4096 once more after it dropped the pair reduction (reports/h200/
# triton-sweep-layer_norm-rowwise-two-sums.json, 2026-11-29): 16-bit 1024 (2, 4), 2048 (1, 4),
# 4096 (2, 8); float32 2048 (2, 16): 96.2 -> 97.9, 95.9 -> 96.5, 94.5 -> 96.6, 96.8 -> 98.9 (bf16;
# float32 for 2048).
ROWWISE_TUNED = {
    ("rms_norm", 2, 1024): (2, 2), ("rms_norm", 2, 2048): (1, 4), ("rms_norm", 2, 4096): (1, 8),
    ("rms_norm", 2, 8192): (1, 8), ("rms_norm", 2, 16384): (1, 32), ("rms_norm", 2, 32768): (1, 16),
    ("layer_norm", 2, 1024): (2, 4), ("layer_norm", 2, 2048): (1, 4), ("layer_norm", 2, 4096): (2, 8),
    ("layer_norm", 2, 8192): (1, 8), ("layer_norm", 2, 16384): (1, 16), ("layer_norm", 2, 32768): (1, 32),
    ("rms_norm", 4, 1024): (1, 4), ("rms_norm", 4, 4096): (1, 16), ("rms_norm", 4, 8192): (1, 16),
    ("rms_norm", 4, 16384): (1, 32),
    ("layer_norm", 4, 1024): (1, 4), ("layer_norm", 4, 2048): (2, 16), ("layer_norm", 4, 4096): (1, 16),
    ("layer_norm", 4, 8192): (1, 8),
    ("layer_norm", 4, 16384): (1, 16),
}

# Many rows: the 1-D one-row kernel (rms_norm_row, layer_norm_row) at these (op, bytes per element,
# N) only, where it measured faster than the [1, BLOCK_N] tile at one row per program (docs/
# perf-notes.md, items 26 and 31): LayerNorm 16-bit 8192 96.5-97.2% against 88.7-89.9%, float32
# 32768 91.3-95.2% against 87.6%; RMSNorm float32 32768 98.2% against 96.5%. Elsewhere it was
# slower, by up to 34 points (LayerNorm bf16 16384). What decides is registers: ptxas gives the
# two forms different counts, and where one crosses a step of blocks per SM the other is faster
# (bf16 16384: 1-D 82 registers, one block of 512 threads; tile 64, two). tools/triton_resources.py
# prints both forms' counts without a GPU.
ROWWISE_ONE_ROW = {("layer_norm", 2, 8192), ("layer_norm", 4, 32768), ("rms_norm", 4, 32768)}
# Looped launch settings measured fastest: (op, bytes per element, N) -> (chunk width, rows per
# program, warps), with N a compile-time constant (9e27a29): 16-bit from
# reports/h200/triton-sweep-looped-static-n.json (bf16; fp16 the same unless LOOPED_TUNED_FLOAT16 says), float32 from
# reports/h200/triton-sweep-looped-fp32.json, both 2026-11-29. 4000, 4096, 131072 and 262144 in
# 16-bit are from the earlier runtime-N sweeps (triton-sweep.json, triton-sweep-layer_norm-looped.json).
LOOPED_TUNED = {
    ("rms_norm", 2, 4000): (1024, 1, 4), ("rms_norm", 2, 4096): (1024, 1, 4), ("rms_norm", 2, 5120): (4096, 1, 8),
    ("rms_norm", 2, 8192): (8192, 1, 16), ("rms_norm", 2, 12288): (8192, 1, 16), ("rms_norm", 2, 16384): (8192, 1, 16),
    ("rms_norm", 2, 32768): (8192, 1, 32), ("rms_norm", 2, 65536): (8192, 1, 32), ("rms_norm", 2, 131072): (8192, 1, 32),
    ("rms_norm", 2, 262144): (8192, 1, 32),
    # A row of one 1024-wide tile (N 513-1024; the key is the tile width), where the looped kernel
    # otherwise takes the rowwise table's setting. The rowwise LayerNorm's new optimum there (2 rows
    # x 4 warps) took the looped one from 98.6% (bf16; fp16 97.7%) at 31eb1f6 to 85.2% (88.1%) at
    # 1ba5d02; 2 x 2 is what it had.
    ("layer_norm", 2, 1024): (1024, 2, 2),
    ("layer_norm", 2, 4000): (1024, 2, 4), ("layer_norm", 2, 4096): (1024, 2, 4), ("layer_norm", 2, 5120): (1024, 2, 4),
    ("layer_norm", 2, 8192): (1024, 1, 4), ("layer_norm", 2, 12288): (2048, 1, 8), ("layer_norm", 2, 16384): (2048, 1, 8),
    ("layer_norm", 2, 32768): (4096, 1, 16), ("layer_norm", 2, 65536): (8192, 1, 32),
    ("layer_norm", 2, 131072): (8192, 1, 32), ("layer_norm", 2, 262144): (8192, 1, 32),
    ("rms_norm", 4, 4000): (2048, 1, 16), ("rms_norm", 4, 4096): (2048, 1, 16), ("rms_norm", 4, 5120): (4096, 1, 16),
    ("rms_norm", 4, 8192): (4096, 1, 16), ("rms_norm", 4, 12288): (4096, 1, 32), ("rms_norm", 4, 16384): (8192, 1, 32),
    ("rms_norm", 4, 32768): (8192, 1, 32), ("rms_norm", 4, 65536): (8192, 1, 32), ("rms_norm", 4, 262144): (8192, 1, 32),
    ("layer_norm", 4, 4000): (4096, 1, 8), ("layer_norm", 4, 4096): (4096, 1, 8), ("layer_norm", 4, 5120): (2048, 2, 16),
    ("layer_norm", 4, 8192): (2048, 1, 16), ("layer_norm", 4, 12288): (4096, 1, 16), ("layer_norm", 4, 16384): (4096, 1, 32),
    ("layer_norm", 4, 32768): (8192, 1, 32), ("layer_norm", 4, 65536): (4096, 1, 32), ("layer_norm", 4, 262144): (4096, 1, 32),
}
# float16 where its optimum differs from bf16's. LayerNorm looped, fp16 on bf16's settings,
# measured 5-15 points below bf16 (the PTX differs only in the conversion instruction); its own
# sweep (reports/h200/triton-sweep-layer_norm-fp16.json, 2026-11-29, with a bf16 control run in
# the same call that reproduced bf16's table) put it at bf16's level: 8192 82.9 -> 97.7%,
# 16384 83.3 -> 94.3%, 5120 85.3 -> 91.7%, 12288 90.4 -> 95.6%, 32768 80.0 -> 87.6% of copy.
LOOPED_TUNED_FLOAT16 = {
    ("layer_norm", 4000): (4096, 1, 8), ("layer_norm", 4096): (1024, 1, 4), ("layer_norm", 5120): (1024, 1, 4),
    ("layer_norm", 8192): (2048, 2, 8), ("layer_norm", 12288): (4096, 1, 8), ("layer_norm", 16384): (4096, 2, 16),
    ("layer_norm", 32768): (8192, 1, 32),
}

# ptxas register caps per thread for the looped kernels (GPU only), where the default measured
# slower (docs/perf-notes.md, item 27). Nsight Compute showed the bf16 LayerNorm at 262144 at 45
# registers, one block of 1024 threads per SM (fp16: 32, two blocks; 55 against 68% of copy); at 32
# it measured 68.4% against 55.2%. fp16 at 65536: 81.7% at a cap of 64 against 74.2% without
# (bf16 78.5% either way); there the cap raises its registers from 32 to 64, one block per SM
# instead of two (tools/triton_resources.py), why faster is not established. (op, bytes per
# element, N) -> registers.
LOOPED_MAXNREG = {("layer_norm", 2, 65536): 64, ("layer_norm", 2, 262144): 32}
# Split kernels (a row over SPLITS programs, x read once): at most SPLIT_MAX programs per row
# (all resident at once, so within the SM count), each holding at most SPLIT_MAX_BLOCK columns.
# Measured (reports/h200/triton-sweep-split*.json, 2026-11-29): 32 float32 values per thread
# was best at every N, and 4096 columns per program for 16-bit x, 8192-16384 for float32.
SPLIT_MAX = 64
SPLIT_MAX_BLOCK = 16384
SPLIT_PER_THREAD = 32
# (op, bytes per element, N) -> (columns per program, warps), the sweeps' fastest.
SPLIT_TUNED = {
    ("rms_norm", 2, 4000): (4096, 4), ("rms_norm", 2, 5120): (2048, 2), ("rms_norm", 2, 8192): (2048, 2),
    ("rms_norm", 2, 12288): (2048, 2), ("rms_norm", 2, 16384): (2048, 2), ("rms_norm", 2, 32768): (8192, 8),
    ("rms_norm", 2, 65536): (4096, 4), ("rms_norm", 2, 262144): (4096, 4),
    ("layer_norm", 2, 32768): (4096, 4), ("layer_norm", 2, 65536): (2048, 2), ("layer_norm", 2, 262144): (4096, 4),
    ("rms_norm", 4, 32768): (16384, 16), ("rms_norm", 4, 65536): (16384, 16), ("rms_norm", 4, 262144): (4096, 4),
    ("layer_norm", 4, 32768): (4096, 4), ("layer_norm", 4, 65536): (8192, 8), ("layer_norm", 4, 262144): (4096, 4),
}


def split_config(n: int, dtype: torch.dtype, op: str) -> LaunchConfig:
    """Columns per program and warps of the split kernels: from SPLIT_TUNED, else the widest
    power of two up to 4096 (8192 for float32) that covers N with under 1/16 of padding
    (5120 -> 5 x 1024), widened while the row would need more than SPLIT_MAX programs."""
    tuned = SPLIT_TUNED.get((op, dtype.itemsize, n))
    if tuned:
        return LaunchConfig(block_n=tuned[0], rows=1, num_warps=tuned[1])
    block_n = max(64, min(4096 if dtype.itemsize <= 2 else 8192, next_pow2(n)))  # 64: two full warps
    while block_n > 1024 and cdiv(n, block_n) * block_n - n > n // 16:
        block_n //= 2
    while cdiv(n, block_n) > SPLIT_MAX:
        block_n *= 2
    # At least 2 warps: Triton 3.6 failed to compile 1-2 warps with 32-64 programs a row
    # (reports/h200/triton-sweep-split-long.log), and 1 warp was never the fastest.
    return LaunchConfig(block_n=block_n, rows=1, num_warps=max(2, _warps(block_n // (32 * SPLIT_PER_THREAD))))


def interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Kernels run on CPU tensors under the interpreter, on CUDA tensors when compiled.
DEVICES: tuple[str, ...] = ("cuda",) if cuda_present() and not interpret_requested() else ("cpu",)


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int  # columns per tile: the whole row (rowwise) or one chunk (looped)
    rows: int  # rows per program
    num_warps: int
    w_first: bool = False  # rowwise: load weight and bias with x (a latency-bound grid)
    maxnreg: int | None = None  # a cap on registers per thread for ptxas (compiled kernels only)
    one_row: bool = False  # rowwise, one row per program: the 1-D kernel (rms_norm_row, layer_norm_row)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


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
        tuned = (LOOPED_TUNED_FLOAT16.get((op, key)) if dtype == torch.float16 else None) or \
            LOOPED_TUNED.get((op, dtype.itemsize, key))
        cap = LOOPED_MAXNREG.get((op, dtype.itemsize, n))
        if tuned:
            return LaunchConfig(*tuned, maxnreg=cap)
        if block_n > 1024:
            block_n = looped_block(n, dtype.itemsize)
            # float32 LayerNorm: 16 per thread (fewer warps) measured 87% where 8 gave 60% (N=16384).
            per_thread = 2 * LOOPED_PER_THREAD if op == "layer_norm" and dtype.itemsize == 4 else LOOPED_PER_THREAD
            return LaunchConfig(block_n=block_n, rows=1, num_warps=_warps(block_n // (32 * per_thread)), maxnreg=cap)
    tuned = ROWWISE_TUNED.get((op, dtype.itemsize, block_n))
    if tuned:
        rows, warps = tuned
    else:
        rows = max(1, min(MAX_ROWS, TILE_ELEMS // block_n))
        warps = _warps(rows * block_n // (32 * PER_THREAD))
    one_row = not looped and rows == 1 and (op, dtype.itemsize, n) in ROWWISE_ONE_ROW
    return LaunchConfig(block_n=block_n, rows=rows, num_warps=warps, one_row=one_row)


def _warps(w: int) -> int:
    """A power of two in [1, MAX_WARPS], rounded down."""
    return min(MAX_WARPS, 1 << (max(1, w).bit_length() - 1))


def looped_block(n: int, itemsize: int) -> int:
    """Chunk width of the looped kernels where LOOPED_TUNED is silent, after what the sweep
    found fastest: for 16-bit x about a quarter of the row (8192 -> 2048, 16384 -> 4096), for
    float32 x the widest chunk; both within [1024, LOOPED_MAX_BLOCK], then narrowed until the
    chunks cover N with under 1/16 of padding (float32 12288 -> 4096 x 3): masked lanes load nothing
    but still hold threads."""
    target = n // 4 if itemsize <= 2 else next_pow2(n)
    block_n = max(1024, min(LOOPED_MAX_BLOCK, 1 << max(0, target.bit_length() - 1)))
    while block_n > 1024 and cdiv(n, block_n) * block_n - n > n // 16:
        block_n //= 2
    return block_n


# The variant the dispatch functions (impls.triton.rms_norm / layer_norm) run, by op and bytes
# per element: (up to N, variant) ranges in order, the last open-ended. From the benchmark of
# 1ba5d02 (reports/h200/benchmark.md, 2026-11-29), the fastest Triton variant at each N, kept
# where it led by a point or more:
# - RMSNorm: looped (N static, the row as one tile up to 1024) everywhere but 16-bit 4000-4096,
#   where rowwise led by 1.0-2.6 points, and float32 32768 (rowwise 96.9% against 90.4%);
#   float32 from 65536: split (89.9% against looped 75.2% at 65536).
# - LayerNorm 16-bit: rowwise up to 5120 (looped 84-93% there), looped beyond; since the 1-D
#   one-row kernel (item 26) rowwise also at 8192 (96.5-97.2% against looped's 93.8% in bf16).
#   At N <= 1024 looped (one tile, its own setting: 98.2-98.3% against 97.0-97.2% at 9f51201).
# - LayerNorm float32: looped up to 8192, rowwise 12288-32768 (97.5% against 93.2% at 12288,
#   86.8% against 78.2% at 32768), split from 65536 (80.4% against 72.9%).
# "split" falls back to looped where split cannot run (no GPU) or the row is too long for it.
DISPATCH = {
    ("rms_norm", 2): ((2048, "looped"), (4096, "rowwise"), (None, "looped")),
    ("rms_norm", 4): ((16384, "looped"), (32768, "rowwise"), (None, "split")),
    ("layer_norm", 2): ((1024, "looped"), (8192, "rowwise"), (None, "looped")),
    ("layer_norm", 4): ((8192, "looped"), (32768, "rowwise"), (None, "split")),
}


# Few rows (decode): rowwise, with launch_config's decode rule, at N up to this. In the 1ba5d02
# benchmark (M 1-64, N 4096 and 8192) rowwise took 1.6-3.1 us, looped 2.0-4.3 us (LayerNorm bf16
# 1 x 8192: 2.36 against 4.01 us), split over 5 us; longer rows were not measured with few rows.
DISPATCH_DECODE_MAX_N = 8192


def choose_variant(op: str, n: int, dtype: torch.dtype, m: int | None = None) -> str:
    """The Triton variant the dispatch functions run for M rows of N elements of ``dtype``
    (DISPATCH; rowwise for few rows; split only where it can run)."""
    if m is not None and m <= DECODE_MAX_ROWS and n <= DISPATCH_DECODE_MAX_N:
        return "rowwise"
    ranges = DISPATCH[(op, 2 if dtype.itemsize <= 2 else 4)]
    variant = next(v for most, v in ranges if most is None or n <= most)
    if variant == "split" and (n > SPLIT_MAX * SPLIT_MAX_BLOCK or split_unavailable() is not None):
        return "looped"
    return variant  # DISPATCH's rowwise ranges end within ROWWISE_MAX_N (tests hold it to that)


def split_unavailable() -> str | None:
    """Why the split kernels cannot run in this process, else None."""
    if state().reason:
        return state().reason
    if state().interpreted:
        return "triton.split's programs wait on each other, and Triton's interpreter runs programs one at a time"
    return None


@dataclass(frozen=True)
class TritonState:
    triton: object | None  # the module, when importable
    kernels: object | None  # impls.triton._kernels, when it loaded
    interpreted: bool
    reason: str | None  # why the backend cannot run here, else None


@lru_cache(maxsize=1)
def state() -> TritonState:
    try:
        triton = importlib.import_module("triton")
    except Exception as exc:
        return TritonState(None, None, False, f"triton not importable: {type(exc).__name__}: {exc}")
    try:
        kernels = importlib.import_module("impls.triton._kernels")
    except Exception as exc:
        return TritonState(triton, None, False, f"triton kernels failed to load: {type(exc).__name__}: {exc}")
    # The mode is fixed when the kernels are decorated; read it from what the decorator returned.
    interpreted = type(kernels.rms_norm_rowwise).__name__ == "InterpretedFunction"
    reason = None
    if not interpreted and not cuda_present():
        reason = (
            "no CUDA device, and triton was imported before impls.triton without TRITON_INTERPRET=1, "
            "so the kernels cannot run; set TRITON_INTERPRET=1 before triton is first imported"
        )
    elif interpreted != ("cpu" in DEVICES):
        reason = "TRITON_INTERPRET changed between importing impls.triton and loading its kernels"
    return TritonState(triton, kernels, interpreted, reason)


def note() -> str:
    s = state()
    if s.triton is None:
        return s.reason or ""
    version = f"triton {getattr(s.triton, '__version__', '?')}"
    if s.interpreted:
        why = "TRITON_INTERPRET=1" if cuda_present() else "no GPU"
        return f"{version}, running under the interpreter ({why})"
    if cuda_present():
        return f"{version} on {torch.cuda.get_device_name()}"
    return version


class TritonKernel(NormKernel):
    backend = "triton"
    devices = DEVICES

    def availability(self) -> str | None:
        return state().reason

    def note(self) -> str:
        return note()

    def bench_unavailable(self) -> str | None:
        if state().interpreted:
            return "triton runs under its interpreter on this machine: not a timing"
        return None

    def compile_key(self, spec):
        if state().interpreted or spec.device != "cuda":
            return None  # the interpreter compiles nothing
        # The JIT specialises on the launch setting, N, the affine flags, and integers equal to
        # one or divisible by 16 (the row count and stride).
        return (self.variant, spec.dtype, spec.n, self.config(spec.n, spec.dtype, spec.rows),
                spec.has_weight, spec.has_bias, spec.rows == 1, spec.row_stride % 16 == 0)

    def config(self, n: int, dtype: torch.dtype, m: int | None = None) -> LaunchConfig:
        return launch_config(n, dtype, looped=self.variant == "looped", op=self.op, m=m)

    def _meta(self, cfg: LaunchConfig) -> dict:
        """Compile-time arguments this variant's kernel takes beyond BLOCK_N and ROUND_BF16."""
        return {"ROWS": cfg.rows}

    def run(self, x: torch.Tensor, cfg: LaunchConfig, tensors: tuple, scalars: tuple, **meta) -> None:
        """Run this variant's kernel on x's rows; its arguments are ``tensors`` then ``scalars``
        (M, N, strides, eps), as both ops' kernels take them."""
        self.launch(self._kernel_name, x, cfg, *tensors, *scalars, **meta)

    def launch_kwargs(self, x: torch.Tensor, cfg: LaunchConfig, **meta) -> dict:
        """The keyword arguments of a launch: compile-time arguments and compile options."""
        kwargs = dict(BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                      ROUND_BF16=state().interpreted and x.dtype == torch.bfloat16, **self._meta(cfg), **meta)
        if cfg.maxnreg and not state().interpreted:
            kwargs["maxnreg"] = cfg.maxnreg
        return kwargs

    def launch(self, kernel_name: str, x: torch.Tensor, cfg: LaunchConfig, *args, grid=None, compile_only=False,
               **meta):
        """Run the kernel on x's device over ``grid``, by default one program per cfg.rows rows.
        Returns the kernel as Triton compiled it (compile_only: without running it)."""
        fn = getattr(state().kernels, kernel_name)
        kwargs = self.launch_kwargs(x, cfg, **meta)
        grid = grid or (cdiv(x.shape[0], cfg.rows),)
        if compile_only:
            return fn.warmup(*args, grid=grid, **kwargs)
        if x.device.type == "cuda":
            with torch.cuda.device(x.device):
                return fn[grid](*args, **kwargs)
        return fn[grid](*args, **kwargs)


class RowwiseKernel(TritonKernel):
    """The rowwise variant: the whole row in one tile, so N is bounded; its kernels take W_FIRST
    (the decode rule's weight-with-x load). Where the launch setting says ``one_row`` (decode, and
    ROWWISE_ONE_ROW) it runs the 1-D form of its kernel (``_row_kernel_name``: the row's offset a
    scalar, no row mask, statistics stored before y; docs/perf-notes.md, item 26)."""

    variant = "rowwise"
    max_n = ROWWISE_MAX_N
    _row_kernel_name: str

    def _meta(self, cfg: LaunchConfig) -> dict:
        rows = {} if cfg.one_row else super()._meta(cfg)
        return {**rows, "W_FIRST": cfg.w_first}

    def run(self, x: torch.Tensor, cfg: LaunchConfig, tensors: tuple, scalars: tuple, **meta) -> None:
        name = self._row_kernel_name if cfg.one_row else self._kernel_name
        self.launch(name, x, cfg, *tensors, *scalars, **meta)


class SplitRowsKernel(TritonKernel):
    """The split variant: each row over SPLITS programs that exchange partial statistics (see
    _kernels.rms_norm_split). GPU only, and every program of a row must be resident at once, so
    the grid is persistent: as many groups of SPLITS programs as the GPU holds, counted from the
    compiled kernel's registers, threads and shared memory."""

    variant = "split"
    max_n = SPLIT_MAX * SPLIT_MAX_BLOCK

    def availability(self) -> str | None:
        return split_unavailable()

    def config(self, n: int, dtype: torch.dtype, m: int | None = None) -> LaunchConfig:
        return split_config(n, dtype, self.op)

    def unsupported(self, spec) -> str | None:
        reason = super().unsupported(spec)
        if reason is None and spec.device == "cuda":
            splits = cdiv(spec.n, self.config(spec.n, spec.dtype).block_n)
            sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
            if splits > sms:
                reason = (f"N={spec.n} splits over {splits} programs that must be resident at once; "
                          f"this GPU has {sms} SMs")
        return reason

    def _meta(self, cfg: LaunchConfig) -> dict:
        return {}  # SPLITS comes from the call, which knows N

    def run(self, x: torch.Tensor, cfg: LaunchConfig, tensors: tuple, scalars: tuple, **meta) -> None:
        """As TritonKernel.run, with the workspace between ``tensors`` and ``scalars`` and the
        group count after them, over a persistent grid of groups x SPLITS programs."""
        m, n = x.shape
        splits = cdiv(n, cfg.block_n)
        meta.update(SPLITS=splits, SPLITS_P2=next_pow2(splits))
        words, done = _split_workspace(x.device)
        key = (self._kernel_name, x.device, x.dtype, n, cfg, tuple(sorted(meta.items())))
        resident = _RESIDENT_PROGRAMS.get(key)
        if resident is None:  # compile once (GROUPS is not specialised on, so any value serves)
            compiled = self.launch(self._kernel_name, x, cfg, *tensors, words, done, *scalars, 1,
                                   grid=(1,), compile_only=True, **meta)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            resident = _RESIDENT_PROGRAMS[key] = sms * programs_per_sm(compiled, x.device)
        groups = max(1, min(m, resident // splits))
        self.launch(self._kernel_name, x, cfg, *tensors, words, done, *scalars, groups,
                    grid=(groups * splits,), **meta)


# Programs of one compiled split kernel the whole GPU holds at once, by launch key.
_RESIDENT_PROGRAMS: dict = {}
_WORKSPACE: dict = {}
# Workspaces made during CUDA graph capture: the graph zeroes them at each replay, so they must
# live as long as it does; one small pair per capture.
_CAPTURED: list = []


def _split_workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernels' exchange words (2 row slots x 2 per program) and per-group DONE
    counters, one set per device and stream, so launches on different streams cannot meet. Made
    zero; every launch leaves them zero."""
    def make():
        programs = torch.cuda.get_device_properties(device).multi_processor_count * 32  # the most in flight
        return (torch.zeros(4 * programs, dtype=torch.int64, device=device),
                torch.zeros(programs, dtype=torch.int32, device=device))

    if torch.cuda.is_current_stream_capturing():
        ws = make()
        _CAPTURED.append(ws)
        return ws
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = make()
    return _WORKSPACE[key]


# What one SM holds on sm_90 (H100, H200): registers, threads, shared memory in bytes.
SM_REGISTERS, SM_THREADS, SM_SHARED = 65536, 2048, 233472


def blocks_per_sm(registers: int, warps: int, shared: int = 0, sm_registers: int = SM_REGISTERS,
                  sm_threads: int = SM_THREADS, sm_shared: int = SM_SHARED) -> int:
    """How many programs (blocks) of ``warps`` warps one SM holds at once, at ``registers`` a
    thread and ``shared`` bytes of shared memory a block; at least 1, at most 32."""
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256  # allocated in units of 256
    by_regs = sm_registers // regs_per_warp // warps
    by_threads = sm_threads // (32 * warps)
    by_shared = sm_shared // (shared + 1024)  # the driver reserves 1 KiB per block
    return max(1, min(32, by_regs, by_threads, by_shared))


def programs_per_sm(compiled, device: torch.device) -> int:
    """How many programs of a compiled Triton kernel one SM of ``device`` holds at once."""
    if hasattr(compiled, "_init_handles"):
        compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    return blocks_per_sm(compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared,
                         getattr(props, "regs_per_multiprocessor", SM_REGISTERS),
                         getattr(props, "max_threads_per_multi_processor", SM_THREADS),
                         getattr(props, "shared_memory_per_multiprocessor", SM_SHARED))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
