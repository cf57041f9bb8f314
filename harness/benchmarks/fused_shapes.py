"""The fused benchmarks' shapes (harness.benchmarks.bench_fused): the headline and full sets, the
kernels selected, the items of a session, the order of its passes, and the bytes each row moves."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.benchmarks.bench_sweep import BenchItem, BenchShape, with_pdl
from harness.judging.cases import DTYPES
from harness.judging.shapes import DECODE_M, DECODE_N, QUICK_BANDWIDTH, QUICK_DECODE, bandwidth_rows
from impls import registry
from impls.fused import ADD_OPS, FusedNormKernel, FusedParams

# -- the shapes -----------------------------------------------------------------------------------
# The headline set (a plain `pytest --benchmark-only` on a GPU): add_rms_norm at N 4096 and 8192,
# in place and with new outputs, at the bandwidth shapes and at decode (1 and 64 rows); rms_norm
# with a float8_e4m3fn output at N 4096 (the dequantisation scale FP8_SCALE), and add_rms_norm to
# float8_e4m3fn with y into a given buffer (out_y: the one convention of a fused add and quantise,
# such as FlashInfer's fused_add_rmsnorm_quant) beside it.
HEADLINE_N = (4096, 8192)
HEADLINE_DECODE_M = (1, 64)
HEADLINE_WRITES = ("in_place", "new")
HEADLINE_FP8 = (("float8_e4m3fn", 4096),)
HEADLINE_ADD_FP8 = (("float8_e4m3fn", 4096, "out_y"),)
FP8_SCALE = 0.5  # y_fp8 = y / FP8_SCALE (a kernel of the "multiply" convention is given 1 / FP8_SCALE)
# The whole sweep (--bench-set full): both add ops at these N and the decode shapes, in place and
# new; out_y, a float32 residual, fp8 outputs and Gemma's weight offset at a few N.
FULL_BANDWIDTH_N = (1024, 2048, 4096, 8192, 16384, 32768)
FULL_OPTION_N = (4096, 8192)
# The quick profile (the CPU, CI): one bandwidth and one decode shape of the plain quick set.
QUICK_SHAPE, QUICK_DECODE_SHAPE = QUICK_BANDWIDTH[0], QUICK_DECODE[0]

WRITE_WORDS = {"new": "new outputs", "in_place": "in place", "out_y": "y into a given buffer"}
MARK = "fused"  # the pytest mark of every fused benchmark: `pytest --benchmark-only -m fused`
BASELINE = "torch.fused"  # the fused groups' baseline unless --bench-baseline names a fused kernel


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES.get(name) or getattr(torch, name)


@dataclass(frozen=True)
class FusedShape(BenchShape):
    """A fused benchmark's problem: the plain shape and the call's choices (impls.fused.FusedParams)."""

    write: str = "new"
    out_dtype: str | None = None  # None: x's dtype; else an fp8 dtype's name
    weight_offset: float = 0.0
    residual_dtype: str | None = None  # None: x's (the add ops)
    scale: float | None = None  # the dequantisation scale of an fp8 y (the "divide" convention)

    @property
    def add(self) -> bool:
        return self.op in ADD_OPS

    @property
    def case(self) -> str:
        """The row's table and target key: the op and every choice that changes the work."""
        parts = [self.op]
        if self.add:
            parts.append(self.write)
        if self.residual_dtype:
            parts.append(f"residual_{self.residual_dtype}")
        if self.out_dtype:
            parts.append(self.out_dtype)
        if self.weight_offset:
            parts.append(f"offset{self.weight_offset:g}")
        return "-".join(parts)

    @property
    def title(self) -> str:
        words = [f"{self.op} (fused)"]
        if self.add:
            words.append(WRITE_WORDS[self.write])
        if self.residual_dtype:
            words.append(f"{self.residual_dtype} residual")
        if self.out_dtype:
            words.append(f"{self.out_dtype} output, scale {self.scale:g}")
        if self.weight_offset:
            words.append(f"weight offset {self.weight_offset:g}")
        return ", ".join(words)

    @property
    def group(self) -> str:
        return f"{self.case}-{self.dtype}-{self.m}x{self.n}"

    # dtypes of the parts
    @property
    def x_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def r_dtype(self) -> torch.dtype | None:
        if not self.add:
            return None
        return DTYPES[self.residual_dtype] if self.residual_dtype else self.x_dtype

    @property
    def y_dtype(self) -> torch.dtype:
        return torch_dtype(self.out_dtype) if self.out_dtype else self.x_dtype

    def params(self, convention: str = "divide") -> FusedParams:
        scale = None
        if self.out_dtype:
            scale = self.scale if convention == "divide" else 1.0 / self.scale
        return FusedParams(weight_offset=self.weight_offset, out_dtype=self.out_dtype and self.y_dtype,
                           scale=scale, write=self.write)

    def arena_parts(self) -> tuple:
        """The parts of this shape in the session's arena (harness.benchmarks.arena.Arena.layout):
        x, weight, bias, y (its own dtype), the statistics; the add ops' residual, residual_out
        (room for float32, viewed in the kernel's dtype) and the pristine x and residual every
        benchmark (and, for a convention that writes its inputs, every timed call) starts from."""
        mn, f32 = (self.m, self.n), torch.float32
        parts = [("x", self.x_dtype, mn), ("w", self.x_dtype, (self.n,)), ("b", self.x_dtype, (self.n,)),
                 ("y", self.y_dtype, mn), ("mean", f32, (self.m,)), ("rstd", f32, (self.m,))]
        if self.add:
            parts += [("r", self.r_dtype, mn), ("r_out", f32, mn), ("x0", self.x_dtype, mn), ("r0", self.r_dtype, mn)]
        return tuple(parts)


def _shape(op, dt, mn, regime, repeat=0, **kw) -> FusedShape:
    return FusedShape(op, dt, mn[0], mn[1], regime, repeat, **kw)


def sweep(profile: str, ops, dtypes, repeat: int = 1, bench_set: str = "full") -> list[FusedShape]:
    """The fused shapes of ``ops`` (impls.fused.FUSED_OPS names) and ``dtypes`` in run order: each bandwidth
    pass, then decode (harness.benchmarks.bench_sweep.sweep's regimes and order)."""
    bw: list[tuple[str, str, tuple, dict]] = []  # (op, dtype, (M, N), choices)
    dc: list[tuple[str, str, tuple, dict]] = []
    fp8 = lambda name: {"out_dtype": name, "scale": FP8_SCALE}  # noqa: E731
    for dt in dtypes:
        if profile == "full" and bench_set == "headline":
            for n in HEADLINE_N:
                for w in HEADLINE_WRITES:
                    bw.append(("add_rms_norm", dt, (bandwidth_rows(n), n), {"write": w}))
                    dc += [("add_rms_norm", dt, (m, n), {"write": w}) for m in HEADLINE_DECODE_M]
            bw += [("rms_norm", dt, (bandwidth_rows(n), n), fp8(name)) for name, n in HEADLINE_FP8]
            bw += [("add_rms_norm", dt, (bandwidth_rows(n), n), {"write": w, **fp8(name)})
                   for name, n, w in HEADLINE_ADD_FP8]
        elif profile == "full":
            for op in ADD_OPS:
                for w in ("in_place", "new"):
                    bw += [(op, dt, (bandwidth_rows(n), n), {"write": w}) for n in FULL_BANDWIDTH_N]
                    dc += [(op, dt, (m, n), {"write": w}) for n in DECODE_N for m in DECODE_M]
            for n in FULL_OPTION_N:
                mn = (bandwidth_rows(n), n)
                bw.append(("add_rms_norm", dt, mn, {"write": "out_y"}))
                if dt != "float32":  # a float32 residual stream beside 16-bit activations
                    bw += [("add_rms_norm", dt, mn, {"write": w, "residual_dtype": "float32"})
                           for w in ("in_place", "new")]
                bw += [("rms_norm", dt, mn, fp8(name)) for name in ("float8_e4m3fn", "float8_e5m2")]
                bw += [("rms_norm", dt, mn, {"weight_offset": 1.0})]
            mn = (bandwidth_rows(4096), 4096)
            bw += [("add_rms_norm", dt, mn, fp8("float8_e4m3fn")), ("layer_norm", dt, mn, fp8("float8_e4m3fn")),
                   ("add_rms_norm", dt, mn, {"write": "out_y", **fp8("float8_e4m3fn")}),
                   ("add_rms_norm", dt, mn, {"write": "in_place", "weight_offset": 1.0})]
            dc += [("rms_norm", dt, (m, n), fp8("float8_e4m3fn")) for n in DECODE_N for m in DECODE_M]
        else:
            for w in HEADLINE_WRITES:
                bw.append(("add_rms_norm", dt, QUICK_SHAPE, {"write": w}))
                dc.append(("add_rms_norm", dt, QUICK_DECODE_SHAPE, {"write": w}))
            bw += [("add_layer_norm", dt, QUICK_SHAPE, {"write": "new"}),
                   ("rms_norm", dt, QUICK_SHAPE, fp8(HEADLINE_FP8[0][0])),
                   ("add_rms_norm", dt, QUICK_SHAPE, {"write": "out_y", **fp8(HEADLINE_FP8[0][0])})]
    ops = set(ops)
    shapes = [_shape(op, dt, mn, "bandwidth", r, **kw) for r in range(repeat) for op, dt, mn, kw in bw if op in ops]
    return shapes + [_shape(op, dt, mn, "decode", **kw) for op, dt, mn, kw in dc if op in ops]


# -- what the run selects ------------------------------------------------------------------------
def baseline_of(config) -> str:
    """The fused groups' baseline: --bench-baseline where it names a fused kernel, else BASELINE
    (the default, torch.eager, is a plain kernel)."""
    asked = config.getoption("bench_baseline")
    return asked if any(k.name == asked for k in registry.kernels(None, family="fused")) else BASELINE


def items(shapes: list[FusedShape], kernels: list[FusedNormKernel], baseline: str) -> list[BenchItem]:
    """Every fused kernel of the shape's op, the baseline first in each group; at decode a kernel
    that can launch with PDL twice (bench_sweep.with_pdl)."""
    out = []
    for s in shapes:
        ks = sorted((k for k in kernels if k.op == s.op), key=lambda k: (k.name != baseline, k.name))
        out += [it for k in ks for it in with_pdl(s, k)]
    return out


def phase(shape: BenchShape, repeat: int) -> int:
    """Where a shape's benchmarks run in the session: the bandwidth passes in order, then decode,
    then backward, so the plain and the fused rows of a pass run in the same pass."""
    if shape.regime == "bandwidth":
        return shape.repeat
    return repeat + (shape.regime == "backward")


# -- bytes ----------------------------------------------------------------------------------------
def fused_bytes(op: str, m: int, n: int, x_dtype: torch.dtype, y_dtype: torch.dtype,
                residual_dtype: torch.dtype | None = None, residual_out_dtype: torch.dtype | None = None,
                has_weight: bool = True, has_bias: bool = False, stats: int = 0) -> int:
    """Fewest bytes a fused call moves: x read, y written (y's dtype: one byte an element for fp8),
    weight and bias read (x's dtype), ``stats`` float32 statistics per row written; the add ops
    also read residual and write residual_out. The same whatever the write convention."""
    e = m * n
    nbytes = e * x_dtype.itemsize + e * y_dtype.itemsize + (int(has_weight) + int(has_bias)) * n * x_dtype.itemsize
    if op in ADD_OPS:
        nbytes += e * residual_dtype.itemsize + e * (residual_out_dtype or residual_dtype).itemsize
    return nbytes + stats * m * 4


# -- one benchmark --------------------------------------------------------------------------------
# Relative L2 error an output may have against the float64 oracle before the benchmark refuses to
# time it: a gross-error screen (rounding to the output's dtype is a few units below each bound).
SCREEN_REL_L2 = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2,
                 torch.float8_e4m3fn: 0.1, torch.float8_e5m2: 0.2}
STATS_REL_L2 = 1e-3
