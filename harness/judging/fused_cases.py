"""The fused family's case catalogue (impls.fused): the residual add, Gemma's (1 + w) and the fp8
output, in rows like the plain catalogue's (harness.judging.cases).

A FusedCase is a Case with the fused call's choices: the residual's dtype, the write convention,
whether x and residual are adjacent views of one buffer, the weight offset and its weights, the
fp8 output and its scale. Its id carries them all, so a failure reproduces from the pytest id
(``fused_case_from_id``). To add a case, add a row to FUSED_ROWS (forward) or
FUSED_BACKWARD_ROWS.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from harness.judging import case_ids
from harness.judging.cases import (AFFINE_ID, AFFINE_PART, ALL, BF16, BOTH, DTYPES, DY_PART, EPS_PART, F32, F32_BF16,
                                   FULL, QUICK, STRIDE_PART, Case, Rows, catalogue, grid)
from harness.judging.runner import device_for
from impls.fused import ADD_OPS, BASE_OP, WRITES, FusedSpec

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

    def record_fields(self) -> dict:
        return {"write": self.write}

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


_WRITE_OF_ID = {v: k for k, v in WRITE_ID.items()}
FusedCase.ID_PARTS = (
    EPS_PART, AFFINE_PART, STRIDE_PART,
    case_ids.IdPart(lambda c: c.residual_dtype and f"r{c.residual_dtype}", r"r(?P<rdtype>float32|float16|bfloat16)",
                    lambda g, shape: {"residual_dtype": g["rdtype"]}),
    case_ids.IdPart(lambda c: WRITE_ID.get(c.write), r"(?P<write>inplace|outy)",
                    lambda g, shape: {"write": _WRITE_OF_ID.get(g["write"], "new")}),
    case_ids.IdPart(lambda c: "adjacent" if c.adjacent else None, r"(?P<adjacent>adjacent)",
                    lambda g, shape: {"adjacent": bool(g["adjacent"])}),
    case_ids.IdPart(lambda c: f"w{c.weight_offset:g}" if c.weight_offset else None, r"w(?P<offset>[0-9.]+)",
                    lambda g, shape: {"weight_offset": case_ids.number(g["offset"], 0.0)}),
    case_ids.IdPart(lambda c: None if c.weight_dist == "default" else f"w{c.weight_dist}", r"w(?P<wdist>small)",
                    lambda g, shape: {"weight_dist": g["wdist"] or "default"}),
    case_ids.IdPart(lambda c: c.out_dtype and f"{c.out_dtype}s{c.scale:g}", r"(?P<fp8>e4m3|e5m2)s(?P<scale>[0-9.e+-]+?)",
                    lambda g, shape: {"out_dtype": g["fp8"], "scale": case_ids.number(g["scale"])}),
    DY_PART,
)


@dataclass(frozen=True)
class FusedRows(Rows):
    """A line of the fused tables: a plain row's fields, the add ops by default, and the fused call's
    choices."""

    ops: tuple[str, ...] = ADD
    residual_dtype: str | None = None
    adjacent: bool = False
    weight_offset: float = 0.0
    weight_dist: str = "default"
    out_dtype: str | None = None
    scale: float | None = None

    def cases(self) -> list[FusedCase]:
        tags = (self.tags,) if isinstance(self.tags, str) else self.tags
        fields = {k: getattr(self, k) for k in ("dist", "eps", "affine", "row_pad", "dy_dist", "adjacent",
                                                 "weight_offset", "weight_dist", "out_dtype", "scale")}
        out = []
        for shape in self.shapes:
            for dt in self.dtypes:
                for op in self.ops:
                    if self.affine == "bias" and BASE_OP[op] != "layer_norm":
                        continue  # RMSNorm takes no bias
                    if op not in ADD_OPS and (self.adjacent or self.residual_dtype):
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
# e5m2's largest finite value is 57344: at y / scale with scale 1e-5 most of a row saturates it
# (a scale the id's %g spells exactly, so the case rebuilds from its id).
E5M2_PAST_MAX = 1e-5

# No row names a write convention: each kernel runs these rows in the conventions it declares
# (with_writes), so an in-place-only kernel gets every edge kind a new-output one does.
FUSED_ROWS = (
    # N not a multiple of any block or vector (N % 8 != 0 among them): padding must not enter the
    # sum's statistics, and the row's tail must be written.
    FusedRows(QUICK, "padded N", grid((3,), PADDED_N), BF16),
    FusedRows(QUICK, "padded N", grid((3,), (129, 4097)), ("float32", "float16")),
    FusedRows(FULL, "padded N", grid((64,), PADDED_N_FULL), ALL),
    FusedRows(QUICK, "M tail", ((65, 769),), BF16),
    FusedRows(FULL, "M tail", grid((1, 2, 3, 5, 17, 65, 129, 1025, 4097), (769, 4096, 8192)), ALL),
    # x and residual adjacent views of one buffer (rows [x | residual]).
    FusedRows(BOTH, "adjacent views", ((17, 1000),), BF16, adjacent=True),
    FusedRows(FULL, "adjacent views", grid((129,), (1000, 4096)), ALL, adjacent=True),
    # A residual stream kept in float32 under 16-bit x: residual_out is float32.
    FusedRows(BOTH, "residual dtype", ((17, 1000),), ("bfloat16", "float16"), residual_dtype="float32"),
    FusedRows(FULL, "residual dtype", grid((1025,), (4096, 8192)), ("bfloat16", "float16"), residual_dtype="float32"),
    # The caller's eps, never a constant of the kernel's own: a large eps moves every row's rstd,
    # and on a constant row it is all of the denominator.
    FusedRows(QUICK, "eps", ((17, 1000),), F32_BF16, eps=0.1),
    FusedRows(QUICK, "eps", ((17, 1000),), BF16, dist="constant", eps=1e-3),
    *(FusedRows(FULL, "eps", grid((129,), (1000, 4097)), ALL, eps=e) for e in (1e-6, 1e-3, 0.1)),
    FusedRows(FULL, "eps", grid((129,), (1000,)), ALL, dist="constant", eps=0.1),
    # Distributions: cancellation, zero variance, extreme magnitudes, NaN isolation; the rounding
    # of the sum (statistics on the float32 or the rounded sum: "sum_rounds" makes them differ).
    *(FusedRows(QUICK, dist, ((17, 1000),), F32_BF16, dist=dist)
      for dist in ("large_mean", "constant", "nan_row", "sum_rounds")),
    FusedRows(QUICK, "nan_row", ((17, 1000),), ("float16",), dist="nan_row"),
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
    FusedRows(QUICK, "weight offset", ((3, 129),), BF16, ops=("add_rms_norm",), weight_offset=1.0),
    # fp8 y: scale 1, tiny (past the maximum: saturates) and huge (subnormals and zeros); at the
    # maximum; NaN in one row; e5m2 on every fp8 op, past its maximum too.
    *(FusedRows(QUICK, "fp8", ((17, 1000),), BF16, ops=FP8_OPS, out_dtype="e4m3", scale=s) for s in (1.0, TINY_SCALE, HUGE_SCALE)),
    *(FusedRows(QUICK, "fp8 e5m2", ((17, 1000),), BF16, ops=FP8_OPS, out_dtype="e5m2", scale=s)
      for s in (TINY_SCALE, E5M2_PAST_MAX)),
    FusedRows(QUICK, "fp8 at the maximum", ((17, 1000),), BF16, ops=FP8_OPS, dist="fp8_max", out_dtype="e4m3", scale=0.5),
    FusedRows(QUICK, "fp8 NaN", ((17, 1000),), BF16, ops=FP8_OPS, dist="nan_row", out_dtype="e4m3", scale=1.0),
    FusedRows(QUICK, "fp8", ((17, 1000),), BF16, ops=("add_rms_norm",), out_dtype="e4m3", scale=0.5, weight_offset=1.0),
    *(FusedRows(FULL, "fp8", grid((129,), (1000, 4096, 8192)), ALL, ops=FP8_OPS, out_dtype=f, scale=s)
      for f in ("e4m3", "e5m2") for s in (1.0, TINY_SCALE, HUGE_SCALE)),
    FusedRows(FULL, "fp8 e5m2", grid((129,), (1000, 4097)), ALL, ops=FP8_OPS, out_dtype="e5m2", scale=E5M2_PAST_MAX),
    *(FusedRows(FULL, "fp8 at the maximum", ((129, 4096),), ALL, ops=FP8_OPS, dist="fp8_max", out_dtype=f, scale=0.5)
      for f in ("e4m3", "e5m2")),
    *(FusedRows(FULL, "fp8 NaN", ((129, 4096),), ALL, ops=FP8_OPS, dist="nan_row", out_dtype=f, scale=1.0)
      for f in ("e4m3", "e5m2")),
    FusedRows(FULL, "fp8", ((129, 4096),), BF16, ops=("add_rms_norm",), out_dtype="e4m3", scale=0.5, weight_offset=1.0),
    # Long rows and decode rows (one and 64 tokens).
    FusedRows(QUICK, "long rows", grid((2,), LONG_N), BF16),
    FusedRows(FULL, "long rows", grid((2,), LONG_N_FULL), F32_BF16),
    FusedRows(QUICK, "decode", ((1, 4096),), BF16),
    FusedRows(FULL, "decode", DECODE, ALL),
    # Affine combinations, layout.
    FusedRows(QUICK, "affine", ((7, 1000),), BF16, affine="none"),
    FusedRows(QUICK, "affine", ((7, 1000),), BF16, affine="bias"),
    *(FusedRows(FULL, "affine", grid((7,), (1000, 4096)), ALL, affine=a) for a in ("none", "weight", "bias")),
    FusedRows(BOTH, "strided rows", ((33, 1000),), BF16, row_pad=64),
    FusedRows(QUICK, "3-D", ((2, 17, 1536),), BF16),
    FusedRows(FULL, "3-D", ((2, 17, 1536), (4, 8, 4000)), F32_BF16),
    FusedRows(FULL, "model shape", ((16384, 4096), (4096, 8192)), ("bfloat16", "float16")),
)

FUSED_BACKWARD_ROWS = (
    BwdFusedRows(QUICK, "padded N", grid((17,), (129, 1000)), BF16, ops=ADD),
    BwdFusedRows(QUICK, "padded N", ((3, 7),), F32, ops=ADD),
    BwdFusedRows(QUICK, "M tail", ((65, 769),), F32, ops=ADD),
    BwdFusedRows(QUICK, "residual dtype", ((17, 1000),), BF16, ops=ADD, residual_dtype="float32"),
    BwdFusedRows(QUICK, "weight offset", ((17, 1000),), F32_BF16, ops=RMS_OPS, weight_offset=1.0),
    BwdFusedRows(QUICK, "affine", ((17, 1000),), F32, ops=ADD, affine="none"),
    BwdFusedRows(QUICK, "eps", ((17, 1000),), F32, ops=ADD, eps=0.1),
    BwdFusedRows(QUICK, "large_mean", ((17, 1000),), BF16, ops=ADD, dist="large_mean"),
    BwdFusedRows(FULL, "padded N", grid((64,), (1, 129, 1000, 4096, 4097, 8192)), ALL, ops=ADD),
    BwdFusedRows(FULL, "M tail", grid((1, 3, 65, 1025, 4097), (769, 4096)), F32, ops=ADD),
    BwdFusedRows(FULL, "residual dtype", grid((129,), (1000, 4096)), ("bfloat16", "float16"), ops=ADD,
                 residual_dtype="float32"),
    BwdFusedRows(FULL, "weight offset", grid((129,), (1000, 4096)), ALL, ops=RMS_OPS, weight_offset=1.0),
    BwdFusedRows(FULL, "large_mean", ((17, 4097),), F32_BF16, ops=ADD, dist="large_mean"),
    BwdFusedRows(FULL, "eps", ((129, 1000),), ALL, ops=ADD, eps=0.1),
    BwdFusedRows(FULL, "dy outliers", ((1025, 1000),), F32, ops=ADD, dy_dist="outliers"),
    BwdFusedRows(FULL, "strided rows", ((33, 1000),), BF16, ops=ADD, row_pad=64),
    *(BwdFusedRows(FULL, "affine", ((17, 1000),), F32, ops=ADD, affine=a) for a in ("none", "weight", "bias")),
)


def accepted_writes(case: FusedCase) -> tuple[str, ...]:
    """The write conventions the interface accepts for the case (impls.fused_validation): the
    residual's conventions are the add ops'; an fp8 y never goes into x's storage."""
    if case.op not in ADD_OPS:
        return ("new",)
    return ("new", "out_y") if case.out_dtype else WRITES


def own_write(kernel, case: FusedCase) -> str:
    """The convention ``kernel`` runs ``case`` in: its first declared one (in WRITES order) the case
    accepts; where none is, the case's first, and the check is skipped with the kernel's reason."""
    accepted = accepted_writes(case)
    return next((w for w in WRITES if w in kernel.writes and w in accepted), accepted[0])


def _runs(kernel, case: FusedCase, device: str, backward: bool) -> bool:
    """Whether the kernel's declarations let it run the case (collection only: never a verdict)."""
    try:
        spec = case.spec(device)
        if kernel.unavailable():  # not here: what it declares decides, as where it runs
            return not kernel.declared_limits(spec)
        return not (kernel.backward_unsupported(spec) if backward else kernel.unsupported(spec))
    except Exception:  # noqa: BLE001 (a declaration that cannot answer here runs nothing extra)
        return False


def edge_kinds(case: FusedCase) -> tuple[str, ...]:
    """What a case stands for: its rows' tags (why it is in the catalogue) and its dtype."""
    return (*case.tags, f"dtype {case.dtype}")


def with_writes(cases: list[FusedCase], kernel, device: str, backward: bool = False) -> list[FusedCase]:
    """The cases ``kernel`` runs: every case of its op in its own convention (own_write), and in
    each other convention it declares, for every edge kind (edge_kinds) the smallest case it can
    run: each edge kind reaches each convention at a fraction of repeating the catalogue."""
    mine = [c for c in cases if c.op == kernel.op]
    out = {(c.id, w): replace(c, write=w) for c in mine for w in [own_write(kernel, c)]}
    for write in kernel.writes:
        best: dict[str, FusedCase] = {}
        for case in mine:
            if write not in accepted_writes(case) or write == own_write(kernel, case):
                continue
            moved = replace(case, write=write)
            if not _runs(kernel, moved, device, backward):
                continue
            for kind in edge_kinds(case):
                held = best.get(kind)
                if held is None or (case.rows * case.n, case.id) < (held.rows * held.n, held.id):
                    best[kind] = moved
        # A dtype already reached by an edge kind's case needs no case of its own.
        reached = {c.dtype for kind, c in best.items() if not kind.startswith("dtype ")}
        out.update({(c.id, c.write): c for kind, c in best.items()
                    if not kind.startswith("dtype ") or kind.removeprefix("dtype ") not in reached})
    return list(out.values())


def write_pairs(cases: list[FusedCase], kernels: list, backward: bool = False) -> list[tuple]:
    """(case, kernel) for every fused kernel, each case in the write conventions the kernel runs it
    in (fused_cases.with_writes); the kernels of one case id together, cases in the catalogue's order."""
    runs = {k: {c.id for c in with_writes(cases, k, device_for(k), backward)} for k in kernels}
    pairs = []
    for case in cases:
        for write in WRITES:
            moved = replace(case, write=write)
            pairs += [(moved, k) for k in kernels if moved.id in runs[k]]
    return pairs


def fused_catalogue(profile: str = "quick", rows: tuple[FusedRows, ...] = FUSED_ROWS) -> list[FusedCase]:
    """The profile's fused cases, without duplicates (harness.judging.cases.catalogue on these rows)."""
    return catalogue(profile, rows)


def fused_backward_catalogue(profile: str = "quick") -> list[FusedCase]:
    return fused_catalogue(profile, FUSED_BACKWARD_ROWS)


def fused_case_from_id(case_id: str) -> FusedCase:
    """Inverse of FusedCase.id: a failing case's inputs, rebuilt outside pytest."""
    return case_ids.from_id(FusedCase, case_id)


__all__ = ["FusedCase", "fused_catalogue", "fused_backward_catalogue", "fused_case_from_id", "with_writes", "write_pairs"]
