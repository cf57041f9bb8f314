"""The fused kernels' plans (impls.tilelang.fused): threads, rows a block, vectors, segments,
the decode rule, PDL and the fp8 output's settings, from (op, dtype, N, affine, vector width, M).
Plain Python: no tilelang import."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.base import dtype_name
from impls.fused import BASE_OP, float32_reciprocal, fp8_max
from impls.gpu_limits import SM_REGISTERS, SM_THREADS, cdiv, next_pow2
from impls.tilelang.plan import DECODE_MAX_ROWS, MAX_THREADS, MIN_BLOCK_THREADS, SPLITK_THREADS, Plan

FUSED_VARIANT = "fused"  # _fused_programs' builder key
# Rows read once (held in registers) up to this N, 32 float32 values a thread at 512 threads;
# longer rows take the two-read program. At the fragment kernel's 32768 (64 values) add_layer_norm
# spilled (128 registers, the most 512 threads may have).
ONE_READ_MAX_N = 16384
# Vectors a thread holds in the one-read program (2 for short rows), as layer_norm_fwd; in each
# segment of the two-read program (half splitk's: the segment is float32 here, and with 4 the
# add ops took 123-132 registers, one block of 256 threads per SM).
VECTORS, SHORT_VECTORS, SHORT_N, SEGMENT_VECTORS = 4, 2, 2048, 2
# The fp8 outputs: torch's dtype -> TileLang's name.
FP8_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
# How an fp8 y takes the scale (FusedPlan.fp8_scale): "divide" each value by it; "reciprocal":
# each thread takes 1/scale once and multiplies; "host_reciprocal": the host passes 1/scale
# (rounded to float32 once) and the kernel multiplies. The two reciprocals give the same bits
# (each is the float32 reciprocal, correctly rounded) and may differ from "divide" by one float32
# ulp before the cast, which the harness's fp8 rule allows; a division costs a thread about ten
# instructions a value, where the output is bandwidth-bound on a byte a value.
FP8_SCALES = ("divide", "reciprocal", "host_reciprocal")
FP8_SCALE = "host_reciprocal"
# The bytes of an fp8 y each thread stores at once (FusedPlan.out_vec): a thread holds that many
# consecutive values (two 16-byte vectors of a 16-bit x), where x's own vector would store 8
# bytes (16-bit x) or 4 (float32). Narrower where N, y's row stride or offset do not allow it.
FP8_STORE_BYTES = 16


def min_blocks_per_sm(threads: int, values: int, extra: int = 32) -> int:
    """The launch bound (blocks per SM) that holds ptxas near 2 registers per float32 value a
    thread holds plus ``extra``: under TileLang's default bound of one block it took 119 registers
    for 32 values (add_layer_norm), 4 blocks of 128 threads per SM. The two-read program's extra
    is 48 (its running statistics: at 32, add_layer_norm spilled 4 bytes)."""
    budget = -(-(2 * values + extra) // 8) * 8
    return max(1, min(SM_THREADS // threads, SM_REGISTERS // (threads * budget)))


@dataclass(frozen=True)
class FusedPlan(Plan):
    """A fused kernel's plan: the op and what it adds to the plain plan. ``residual_dtype`` None:
    no residual; ``out_dtype`` None: y in x's dtype; ``segments`` 1: the row read once; an fp8 y's
    vector (``out_vec`` elements: its row stride is passed in these) and scale (``fp8_scale``)."""

    op: str = "add_rms_norm"
    residual_dtype: str | None = None
    out_dtype: str | None = None
    weight_offset: float = 0.0
    segments: int = 1
    out_vec: int | None = None  # None: y in x's vector (no fp8 output)
    fp8_scale: str = FP8_SCALE

    @property
    def layer_norm(self) -> bool:
        return BASE_OP[self.op] == "layer_norm"

    @property
    def fp8_max(self) -> float:
        return fp8_max(getattr(torch, self.out_dtype))

    @property
    def group(self) -> int:
        """Consecutive columns a thread holds: x's vector, or an fp8 y's where that is longer."""
        return max(self.vec, self.out_vec or self.vec)

    def describe(self) -> str:
        fp8 = f"y {self.out_dtype} ({self.out_vec}-byte stores, {self.fp8_scale})" if self.out_dtype else ""
        extras = [f"residual {self.residual_dtype}" if self.residual_dtype else "",
                  f"weight + {self.weight_offset:g}" if self.weight_offset else "", fp8,
                  "one read" if self.segments == 1 else f"two reads, {self.segments} segments"]
        return super().describe().replace("tilelang.fused", f"tilelang.fused {self.op}", 1).replace(
            "; vec", "; " + ", ".join(e for e in extras if e) + "; vec", 1)


def choose_out_vec(n: int, strides: tuple[int, ...] = (), offsets: tuple[int, ...] = ()) -> int:
    """An fp8 y's vector in elements (bytes): FP8_STORE_BYTES, halved until it divides N, y's row
    stride and its offset from a 16-byte boundary."""
    v = FP8_STORE_BYTES
    while v > 1 and (n % v or any(s % v for s in strides) or any(o % v for o in offsets)):
        v //= 2
    return v


def fused_plan(op: str, dtype: torch.dtype | str, n: int, has_weight: bool, has_bias: bool, vec: int,
               residual_dtype: str | None = None, out_dtype: str | None = None, weight_offset: float = 0.0,
               m: int | None = None, pdl: bool = False, out_vec: int | None = None, fp8_scale: str = FP8_SCALE,
               threads_per_row: int | None = None, min_blocks: int | None = None) -> FusedPlan:
    """The plan for M rows (None: many). Rows up to ONE_READ_MAX_N are read once, about VECTORS
    vectors a thread; longer ones twice, in segments. Few rows (M <= DECODE_MAX_ROWS, read once:
    the decode rule) take one row a block (the grid cannot fill the GPU, and a block of several
    rows would leave SMs idle) and no launch bound, with the same threads a row: each row is reduced
    by the same threads in the same order at every M, so its bits do not change where M crosses
    DECODE_MAX_ROWS. ``pdl``: the PDL form (read once only; the kernel asks for it where PDL
    runs). An fp8 y: ``out_vec`` (default: choose_out_vec for a contiguous, aligned y) and
    ``fp8_scale`` (FP8_SCALES). ``threads_per_row`` and ``min_blocks`` override the rules (a
    probe's candidates)."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    if fp8_scale not in FP8_SCALES:
        raise ValueError(f"fp8_scale {fp8_scale!r}: one of {', '.join(FP8_SCALES)}")
    fp8 = out_dtype is not None
    out_vec = (out_vec or choose_out_vec(n)) if fp8 else None
    common = dict(op=op, residual_dtype=residual_dtype, out_dtype=out_dtype, weight_offset=float(weight_offset),
                  out_vec=out_vec, fp8_scale=fp8_scale if fp8 else FP8_SCALE)
    group = max(vec, out_vec or vec)
    if n <= ONE_READ_MAX_N:
        per_thread = VECTORS if n > SHORT_N else SHORT_VECTORS
        tpr = threads_per_row or min(MAX_THREADS, max(32, next_pow2(cdiv(n, max(vec * per_thread, group)))))
        padded = cdiv(n, tpr * group) * tpr * group
        decode = m is not None and m <= DECODE_MAX_ROWS
        rows = 1 if decode else max(1, MIN_BLOCK_THREADS // tpr)
        bound = min_blocks or (1 if decode else min_blocks_per_sm(tpr * rows, padded // tpr))
        return FusedPlan(FUSED_VARIANT, dt, n, has_weight, has_bias, vec, tpr, rows, padded, bound, pdl=pdl,
                         **common)
    tpr = threads_per_row or SPLITK_THREADS
    seg = tpr * max(vec * SEGMENT_VECTORS, group)
    bound = min_blocks or min_blocks_per_sm(tpr, seg // tpr, 48)
    return FusedPlan(FUSED_VARIANT, dt, n, has_weight, has_bias, vec, tpr, 1, seg, bound, segments=cdiv(n, seg),
                     **common)


def fp8_scale_argument(plan: FusedPlan, scale: float | None) -> float:
    """The kernel's scale argument: 1.0 without an fp8 y; the scale; or, for "host_reciprocal",
    1/scale in float32 (impls.fused.float32_reciprocal)."""
    if plan.out_dtype is None:
        return 1.0
    if plan.fp8_scale != "host_reciprocal":
        return float(scale)
    return float32_reciprocal(scale)
