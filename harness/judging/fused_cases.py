"""The fused family's case catalogue (impls.fused): the residual add, Gemma's (1 + w) and the fp8
output, in rows like the plain catalogue's (harness.judging.cases).

A FusedCase is a Case with the fused call's choices: the residual's dtype, the write convention,
whether x and residual are adjacent views of one buffer, the weight offset and its weights, the
fp8 output and its scale. Its id carries them all, so a failure reproduces from the pytest id
(``fused_case_from_id``). To add a case, add a row to FUSED_ROWS (forward) or
FUSED_BACKWARD_ROWS.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import torch

from harness.judging.cases import AFFINE_ID, ALL, BF16, BOTH, DTYPES, F32, F32_BF16, FULL, QUICK, Case, catalogue, grid
from impls.fused import ADD_OPS, BASE_OP, FusedSpec

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
WRITE_ID = {"in_place": "inplace", "out_y": "outy"}
ADD = ADD_OPS
FP8_OPS = ("rms_norm", "add_rms_norm", "layer_norm")
RMS_OPS = ("rms_norm", "add_rms_norm")
TINY_SCALE, HUGE_SCALE = 2.0**-8, 2.0**8  # most of y saturates e4m3fn; most of y is subnormal or zero


@dataclass(frozen=True)
class FusedCase(Case):
    residual_dtype: str | None = None  # the add ops' residual: None is x's dtype
    write: str = "new"  # impls.fused.WRITES
    adjacent: bool = False  # x and residual adjacent views of one buffer (rows [x | residual])
    weight_offset: float = 0.0
    weight_dist: str = "default"  # "small": |w| < 2**-8, where (1 + w) rounded to x's dtype loses w
    out_dtype: str | None = None  # "e4m3" or "e5m2": an fp8 y with ``scale``
    scale: float | None = None
    tags: tuple[str, ...] = field(default=(), compare=False)

    @property
    def has_bias(self) -> bool:
        return self.affine in ("weight_bias", "bias") and BASE_OP[self.op] == "layer_norm"

    @property
    def residual_torch_dtype(self) -> torch.dtype | None:
        if self.op not in ADD_OPS:
            return None
        return DTYPES[self.residual_dtype or self.dtype]

    @property
    def out_torch_dtype(self) -> torch.dtype | None:
        return None if self.out_dtype is None else FP8[self.out_dtype]

    @property
    def id(self) -> str:
        parts = [self.op, self.dtype, "x".join(map(str, self.shape)), self.dist]
        if self.eps is not None:
            parts.append(f"eps{self.eps:g}")
        if self.affine != "weight_bias":
            parts.append(AFFINE_ID[self.affine])
        if self.row_pad:
            parts.append(f"stride{self.n + self.row_pad}")
        if self.residual_dtype:
            parts.append(f"r{self.residual_dtype}")
        if self.write != "new":
            parts.append(WRITE_ID[self.write])
        if self.adjacent:
            parts.append("adjacent")
        if self.weight_offset:
            parts.append(f"w{self.weight_offset:g}")
        if self.weight_dist != "default":
            parts.append(f"w{self.weight_dist}")
        if self.out_dtype:
            parts.append(f"{self.out_dtype}s{self.scale:g}")
        if self.dy_dist is not None:
            parts.append(f"dy{self.dy_dist}")
        return "-".join(parts)

    @property
    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.id.encode()).digest()[:4], "little")

    def spec(self, device: str) -> FusedSpec:
        return FusedSpec(op=self.op, dtype=self.torch_dtype, rows=self.rows, n=self.n, row_stride=self.n + self.row_pad,
                         device=device, has_weight=self.has_weight, has_bias=self.has_bias,
                         residual_dtype=self.residual_torch_dtype, weight_offset=float(self.weight_offset),
                         out_dtype=self.out_torch_dtype, write=self.write)

    def nbytes(self) -> int:
        size = self.rows * (self.n + self.row_pad) * self.torch_dtype.itemsize
        if self.op in ADD_OPS:
            size += self.rows * (self.n + self.row_pad) * self.residual_torch_dtype.itemsize
        return size


@dataclass(frozen=True)
class FusedRows:
    """Cases of one line of a table: every shape x dtype x op, with these fields and tags."""

    profiles: tuple[str, ...]
    tags: str | tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    ops: tuple[str, ...] = ADD
    dist: str = "normal"
    eps: float | None = None
    affine: str = "weight_bias"
    row_pad: int = 0
    dy_dist: str | None = None
    residual_dtype: str | None = None
    write: str = "new"
    adjacent: bool = False
    weight_offset: float = 0.0
    weight_dist: str = "default"
    out_dtype: str | None = None
    scale: float | None = None

    def cases(self) -> list[FusedCase]:
        tags = (self.tags,) if isinstance(self.tags, str) else self.tags
        fields = {k: getattr(self, k) for k in ("dist", "eps", "affine", "row_pad", "dy_dist", "write", "adjacent",
                                                 "weight_offset", "weight_dist", "out_dtype", "scale")}
        out = []
        for shape in self.shapes:
            for dt in self.dtypes:
                for op in self.ops:
                    if self.affine == "bias" and BASE_OP[op] != "layer_norm":
                        continue  # RMSNorm takes no bias
                    if op not in ADD_OPS and (self.write != "new" or self.adjacent or self.residual_dtype):
                        continue  # the residual's choices are the add ops'
                    residual = self.residual_dtype if op in ADD_OPS and self.residual_dtype != dt else None
                    out.append(FusedCase(op=op, dtype=dt, shape=shape, tags=tags, residual_dtype=residual, **fields))
        return out


def BwdFusedRows(*args, dy_dist: str = "normal", **fields) -> FusedRows:  # noqa: N802 (a row, as FusedRows)
    return FusedRows(*args, dy_dist=dy_dist, **fields)


PADDED_N = (1, 7, 129, 1000, 4097)
PADDED_N_FULL = (1, 7, 33, 129, 257, 1000, 1023, 2049, 4000, 4096, 4097, 5120, 8192, 12345)
LONG_N, LONG_N_FULL = (16384,), (16384, 32768, 65536)
DECODE = ((1, 4096), (1, 8192), (64, 4096), (64, 8192))

FUSED_ROWS = (
    # N not a multiple of any block: padding must not enter the sum's statistics.
    FusedRows(QUICK, "padded N", grid((3,), PADDED_N), BF16),
    FusedRows(QUICK, "padded N", grid((3,), (129, 4097)), F32),
    FusedRows(FULL, "padded N", grid((64,), PADDED_N_FULL), ALL),
    FusedRows(QUICK, "M tail", ((65, 769),), BF16),
    FusedRows(FULL, "M tail", grid((1, 2, 3, 5, 17, 65, 129, 1025, 4097), (769, 4096, 8192)), ALL),
    # The write conventions, each on separate buffers and on adjacent views of one.
    *(FusedRows(BOTH, "write convention", ((17, 1000),), F32_BF16, write=w) for w in ("in_place", "out_y")),
    *(FusedRows(BOTH, "adjacent views", ((17, 1000),), BF16, write=w, adjacent=True) for w in ("new", "in_place")),
    FusedRows(FULL, "adjacent views", grid((129,), (1000, 4096)), ALL, write="out_y", adjacent=True),
    # A residual stream kept in float32 under 16-bit x: residual_out is float32, in place too.
    *(FusedRows(BOTH, "residual dtype", ((17, 1000),), ("bfloat16", "float16"), residual_dtype="float32", write=w)
      for w in ("new", "in_place")),
    FusedRows(FULL, "residual dtype", grid((1025,), (4096, 8192)), ("bfloat16", "float16"), residual_dtype="float32"),
    # Distributions: cancellation, zero variance, extreme magnitudes, NaN isolation; the rounding
    # of the sum (statistics on the float32 or the rounded sum: "sum_rounds" makes them differ).
    *(FusedRows(QUICK, dist, ((17, 1000),), F32_BF16, dist=dist)
      for dist in ("large_mean", "constant", "nan_row", "sum_rounds")),
    *(FusedRows(FULL, dist, grid((1025,), (1000, 4096)), ALL, dist=dist)
      for dist in ("large_mean", "constant", "nan_row", "offset", "outlier_first", "sum_rounds")),
    FusedRows(BOTH, "tiny", ((5, 4000),), ALL, dist="tiny"),
    FusedRows(BOTH, "huge", ((5, 4000),), ALL, dist="huge"),
    # Gemma's (1 + w): the offset on ordinary weights, and on weights |w| < 2**-8 where adding 1
    # after rounding to x's dtype loses w.
    FusedRows(QUICK, "weight offset", ((17, 1000),), F32_BF16, ops=RMS_OPS, weight_offset=1.0),
    FusedRows(QUICK, "weight offset", ((17, 1000),), BF16, ops=RMS_OPS, weight_offset=1.0, weight_dist="small"),
    FusedRows(FULL, "weight offset", grid((129,), (1000, 4096)), ALL, ops=RMS_OPS, weight_offset=1.0),
    FusedRows(FULL, "weight offset", grid((129,), (1000, 4096)), ALL, ops=RMS_OPS, weight_offset=1.0, weight_dist="small"),
    FusedRows(BOTH, "weight offset", ((17, 1000),), BF16, ops=("add_rms_norm",), weight_offset=1.0, write="in_place"),
    # fp8 y: scale 1, tiny (past the maximum: saturates) and huge (subnormals and zeros); at the
    # maximum; NaN in one row.
    *(FusedRows(QUICK, "fp8", ((17, 1000),), BF16, ops=FP8_OPS, out_dtype="e4m3", scale=s) for s in (1.0, TINY_SCALE, HUGE_SCALE)),
    FusedRows(QUICK, "fp8", ((17, 1000),), BF16, ops=("rms_norm",), out_dtype="e5m2", scale=TINY_SCALE),
    FusedRows(QUICK, "fp8 at the maximum", ((17, 1000),), BF16, ops=FP8_OPS, dist="fp8_max", out_dtype="e4m3", scale=0.5),
    FusedRows(QUICK, "fp8 NaN", ((17, 1000),), BF16, ops=FP8_OPS, dist="nan_row", out_dtype="e4m3", scale=1.0),
    FusedRows(QUICK, "fp8", ((17, 1000),), BF16, ops=("add_rms_norm",), out_dtype="e4m3", scale=0.5, write="out_y",
              weight_offset=1.0),
    *(FusedRows(FULL, "fp8", grid((129,), (1000, 4096, 8192)), ALL, ops=FP8_OPS, out_dtype=f, scale=s)
      for f in ("e4m3", "e5m2") for s in (1.0, TINY_SCALE, HUGE_SCALE)),
    *(FusedRows(FULL, "fp8 at the maximum", ((129, 4096),), ALL, ops=FP8_OPS, dist="fp8_max", out_dtype=f, scale=0.5)
      for f in ("e4m3", "e5m2")),
    *(FusedRows(FULL, "fp8 NaN", ((129, 4096),), ALL, ops=FP8_OPS, dist="nan_row", out_dtype=f, scale=1.0)
      for f in ("e4m3", "e5m2")),
    FusedRows(FULL, "fp8", ((129, 4096),), BF16, ops=("add_rms_norm",), out_dtype="e4m3", scale=0.5, write="out_y"),
    # Long rows and decode rows (one and 64 tokens), in place as models call them.
    FusedRows(QUICK, "long rows", grid((2,), LONG_N), BF16, write="in_place"),
    FusedRows(FULL, "long rows", grid((2,), LONG_N_FULL), F32_BF16, write="in_place"),
    FusedRows(QUICK, "decode", ((1, 4096),), BF16, write="in_place"),
    FusedRows(FULL, "decode", DECODE, ALL, write="in_place"),
    # Affine combinations, layout.
    FusedRows(QUICK, "affine", ((7, 1000),), BF16, affine="none"),
    FusedRows(QUICK, "affine", ((7, 1000),), BF16, affine="bias"),
    *(FusedRows(FULL, "affine", grid((7,), (1000, 4096)), ALL, affine=a) for a in ("none", "weight", "bias")),
    FusedRows(BOTH, "strided rows", ((33, 1000),), BF16, row_pad=64),
    FusedRows(BOTH, "strided rows", ((33, 1000),), BF16, row_pad=64, write="in_place"),
    FusedRows(QUICK, "3-D", ((2, 17, 1536),), BF16),
    FusedRows(FULL, "3-D", ((2, 17, 1536), (4, 8, 4000)), F32_BF16),
    FusedRows(FULL, "model shape", ((16384, 4096), (4096, 8192)), ("bfloat16", "float16"), write="in_place"),
)

FUSED_BACKWARD_ROWS = (
    BwdFusedRows(QUICK, "padded N", grid((17,), (129, 1000)), BF16, ops=ADD),
    BwdFusedRows(QUICK, "M tail", ((65, 769),), F32, ops=ADD),
    BwdFusedRows(QUICK, "residual dtype", ((17, 1000),), BF16, ops=ADD, residual_dtype="float32"),
    BwdFusedRows(QUICK, "weight offset", ((17, 1000),), F32_BF16, ops=RMS_OPS, weight_offset=1.0),
    BwdFusedRows(QUICK, "affine", ((17, 1000),), F32, ops=ADD, affine="none"),
    BwdFusedRows(FULL, "padded N", grid((64,), (1, 129, 1000, 4096, 4097, 8192)), ALL, ops=ADD),
    BwdFusedRows(FULL, "M tail", grid((1, 3, 65, 1025, 4097), (769, 4096)), F32, ops=ADD),
    BwdFusedRows(FULL, "residual dtype", grid((129,), (1000, 4096)), ("bfloat16", "float16"), ops=ADD,
                 residual_dtype="float32"),
    BwdFusedRows(FULL, "weight offset", grid((129,), (1000, 4096)), ALL, ops=RMS_OPS, weight_offset=1.0),
    BwdFusedRows(FULL, "large_mean", ((17, 4097),), F32_BF16, ops=ADD, dist="large_mean"),
    BwdFusedRows(FULL, "dy outliers", ((1025, 1000),), F32, ops=ADD, dy_dist="outliers"),
    *(BwdFusedRows(FULL, "affine", ((17, 1000),), F32, ops=ADD, affine=a) for a in ("none", "weight", "bias")),
)


def fused_catalogue(profile: str = "quick", rows: tuple[FusedRows, ...] = FUSED_ROWS) -> list[FusedCase]:
    """The profile's fused cases, without duplicates (harness.judging.cases.catalogue on these rows)."""
    return catalogue(profile, rows)


def fused_backward_catalogue(profile: str = "quick") -> list[FusedCase]:
    return fused_catalogue(profile, FUSED_BACKWARD_ROWS)


_ID = re.compile(
    r"(?P<op>[a-z_]+)-(?P<dtype>[a-z0-9]+)-(?P<shape>[0-9x]+)-(?P<dist>[a-z0-9_]+)"
    r"(?:-eps(?P<eps>[0-9.e+-]+?))?(?:-(?P<affine>noaffine|weightonly|biasonly))?(?:-stride(?P<stride>[0-9]+))?"
    r"(?:-r(?P<rdtype>float32|float16|bfloat16))?(?:-(?P<write>inplace|outy))?(?P<adjacent>-adjacent)?"
    r"(?:-w(?P<offset>[0-9.]+))?(?:-w(?P<wdist>small))?(?:-(?P<fp8>e4m3|e5m2)s(?P<scale>[0-9.e+-]+?))?"
    r"(?:-dy(?P<dy>[a-z_]+))?$"
)


def fused_case_from_id(case_id: str) -> FusedCase:
    """Inverse of FusedCase.id: a failing case's inputs, rebuilt outside pytest."""
    m = _ID.match(case_id)
    if not m:
        raise ValueError(f"not a fused case id: {case_id!r}")
    shape = tuple(int(s) for s in m["shape"].split("x"))
    return FusedCase(
        op=m["op"], dtype=m["dtype"], shape=shape, dist=m["dist"], eps=float(m["eps"]) if m["eps"] else None,
        affine={v: k for k, v in AFFINE_ID.items()}.get(m["affine"], "weight_bias"),
        row_pad=int(m["stride"]) - shape[-1] if m["stride"] else 0, dy_dist=m["dy"], residual_dtype=m["rdtype"],
        write={v: k for k, v in WRITE_ID.items()}.get(m["write"], "new"), adjacent=bool(m["adjacent"]),
        weight_offset=float(m["offset"]) if m["offset"] else 0.0, weight_dist=m["wdist"] or "default",
        out_dtype=m["fp8"], scale=float(m["scale"]) if m["scale"] else None)


__all__ = ["FusedCase", "fused_catalogue", "fused_backward_catalogue", "fused_case_from_id"]
