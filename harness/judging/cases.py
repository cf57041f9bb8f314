"""The case catalogue: plain values, expanded from two tables of rows.

A Case says everything needed to rebuild its inputs bit for bit (the seed is derived from its id),
so a failure reproduces from the pytest id alone. Profiles pick subsets: ``quick`` for CPU and
CI, ``full`` for a GPU.

To add a case, add a row (``Rows``: profiles, tags, shapes, dtypes, then dist, eps, affine,
row_pad, ops) to ``FORWARD_ROWS`` for the forward checks or to ``BACKWARD_ROWS`` for the backward
ones (``catalogue`` and ``backward_catalogue`` expand them); a new N or M for every case goes in
harness/judging/shapes.py.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from harness.judging import case_ids
from harness.judging.shapes import (BACKWARD_LARGE_M, BACKWARD_N, BACKWARD_N_FULL, BACKWARD_TAIL_M, BACKWARD_TAIL_M_FULL,
                            CHECK_LONG_N, CHECK_LONG_N_QUICK, HUGE_CASES, ODD_N, POW2_N, TAIL_M, TAIL_M_FULL)
from impls.base import DEFAULT_EPS, NormSpec

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Which of weight and bias a case passes; each is a combination the interface accepts for some
# op (tests/test_interface.py enumerates them and fails if one is never exercised).
AFFINE = ("weight_bias", "weight", "bias", "none")
AFFINE_ID = {"none": "noaffine", "weight": "weightonly", "bias": "biasonly"}  # the case id's suffix


def affine_of(has_weight: bool, has_bias: bool) -> str:
    """The AFFINE value of a weight and bias given or not (the inverse of Case.has_weight/has_bias)."""
    return {(True, True): "weight_bias", (True, False): "weight", (False, True): "bias", (False, False): "none"}[
        (has_weight, has_bias)]


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    shape: tuple[int, ...]  # (M, N) or (B, S, N)
    dist: str = "normal"  # see harness.judging.inputs.make_x
    eps: float | None = None  # None: the op's default
    affine: str = "weight_bias"  # one of AFFINE; rms_norm has no bias ("bias" is LayerNorm's only)
    row_pad: int = 0  # extra elements between rows of x (strided rows)
    dy_dist: str | None = None  # a backward case: the distribution of dy (see make_dy); None: forward
    tags: tuple[str, ...] = field(default=(), compare=False)  # why the case is in the catalogue
    # The id's modifiers, in order (harness.judging.case_ids); a family's case class extends them.
    ID_PARTS: ClassVar[tuple[case_ids.IdPart, ...]]

    @property
    def n(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def eps_value(self) -> float:
        return DEFAULT_EPS[self.op] if self.eps is None else self.eps

    @property
    def has_weight(self) -> bool:
        return self.affine in ("weight", "weight_bias")

    @property
    def has_bias(self) -> bool:
        return self.affine in ("weight_bias", "bias") and self.op == "layer_norm"

    @property
    def id(self) -> str:
        return case_ids.spell(self)

    def record_fields(self) -> dict:
        """What a check's record keeps of the case beyond its id, dtype and tags."""
        return {}

    @property
    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.id.encode()).digest()[:4], "little")

    @property
    def dy_seed(self) -> int:
        """dy's own seed, derived from the id as x's is (so dy does not repeat x's draws)."""
        return int.from_bytes(hashlib.sha256((self.id + "/dy").encode()).digest()[:4], "little")

    def spec(self, device: str) -> NormSpec:
        return NormSpec(
            op=self.op,
            dtype=self.torch_dtype,
            rows=self.rows,
            n=self.n,
            row_stride=self.n + self.row_pad,
            device=device,
            has_weight=self.has_weight,
            has_bias=self.has_bias,
        )

    def nbytes(self) -> int:
        return self.rows * (self.n + self.row_pad) * self.torch_dtype.itemsize


_AFFINE_OF_ID = {v: k for k, v in AFFINE_ID.items()}
EPS_PART = case_ids.IdPart(lambda c: None if c.eps is None else f"eps{c.eps:g}", r"eps(?P<eps>[0-9.e+-]+?)",
                           lambda g, shape: {"eps": case_ids.number(g["eps"])})
AFFINE_PART = case_ids.IdPart(lambda c: AFFINE_ID.get(c.affine), r"(?P<affine>noaffine|weightonly|biasonly)",
                              lambda g, shape: {"affine": _AFFINE_OF_ID.get(g["affine"], "weight_bias")})
STRIDE_PART = case_ids.IdPart(lambda c: f"stride{c.n + c.row_pad}" if c.row_pad else None, r"stride(?P<stride>[0-9]+)",
                              lambda g, shape: {"row_pad": int(g["stride"]) - shape[-1] if g["stride"] else 0})
DY_PART = case_ids.IdPart(lambda c: None if c.dy_dist is None else f"dy{c.dy_dist}", r"dy(?P<dy>[a-z_]+)",
                          lambda g, shape: {"dy_dist": g["dy"]})
Case.ID_PARTS = (EPS_PART, AFFINE_PART, STRIDE_PART, DY_PART)


# -- the catalogue: tables of rows -----------------------------------------------------------
# Each table is a tuple of Rows; a row expands to every shape x dtype x op it names, in that order
# (the ops innermost), in the profiles it names.
QUICK, FULL, BOTH = ("quick",), ("full",), ("quick", "full")
ALL = tuple(DTYPES)  # float32, float16, bfloat16
F32, F16, BF16, F32_BF16 = ("float32",), ("float16",), ("bfloat16",), ("float32", "bfloat16")


@dataclass(frozen=True)
class Rows:
    """Cases of one line of a table: every shape x dtype x op, with these fields and tags."""

    profiles: tuple[str, ...]
    tags: str | tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    dist: str = "normal"
    eps: float | None = None
    affine: str = "weight_bias"
    row_pad: int = 0
    dy_dist: str | None = None
    ops: tuple[str, ...] = ("rms_norm", "layer_norm")

    def cases(self) -> list[Case]:
        tags = (self.tags,) if isinstance(self.tags, str) else self.tags
        ops = [op for op in self.ops if op == "layer_norm" or self.affine != "bias"]  # RMSNorm takes no bias
        return [Case(op=op, dtype=dt, shape=shape, dist=self.dist, eps=self.eps, affine=self.affine,
                     row_pad=self.row_pad, dy_dist=self.dy_dist, tags=tags)
                for shape in self.shapes for dt in self.dtypes for op in ops]


def BwdRows(*args, dy_dist: str = "normal", **fields) -> Rows:  # noqa: N802 (a row, as Rows)
    """A row of BACKWARD_ROWS: dy standard normal unless it says otherwise."""
    return Rows(*args, dy_dist=dy_dist, **fields)


def quick_and_full(row, tags, quick_shapes, quick_dtypes, full_shapes=None, **fields) -> tuple[Rows, Rows]:
    """One kind of case in both profiles, as two rows of ``row`` (Rows or BwdRows): the quick
    profile's shapes in its dtypes, the full profile's (default: the same) in every dtype. A
    profile expands only its own rows, so the pair keeps each profile's order where it stands."""
    return (row(QUICK, tags, quick_shapes, quick_dtypes, **fields),
            row(FULL, tags, quick_shapes if full_shapes is None else full_shapes, ALL, **fields))


def grid(ms, ns) -> tuple[tuple[int, int], ...]:
    """Every M x N, M outer."""
    return tuple((m, n) for m in ms for n in ns)


PADDED_N = tuple(sorted(set(ODD_N + POW2_N)))
TAIL_N = (769, 4000, 4096, 8192)  # N of the full profile's M tails
DIST_N_QUICK, DIST_N_FULL = (129, 1000, 4000, 4097), (129, 1000, 4000, 4096, 4097, 12345, 65536)

FORWARD_ROWS = (
    # Row length N: odd sizes and powers of two (padding must not enter the statistics); the quick
    # profile runs the powers of two in bfloat16 only.
    *(Rows(QUICK, "padded N", ((3, n),), ALL if n in ODD_N else BF16) for n in PADDED_N),
    Rows(FULL, "padded N", grid((64,), PADDED_N), ALL),
    Rows(QUICK, "long rows", grid((2,), CHECK_LONG_N_QUICK), BF16),
    Rows(FULL, "long rows", grid((2,), CHECK_LONG_N), ("bfloat16", "float32")),
    # Row count M: tails of any rows-per-program choice. The quick profile runs its largest tail
    # (TAIL_M's last, 1025 rows: several programs of any rows-per-program) at the shorter N only:
    # interpreted Triton spent 12 s a kernel on each 1025 x 4000 case in CI, for a tail 1025 x 769
    # also has.
    Rows(QUICK, "M tail", grid(TAIL_M[:-1], (769, 4000)) + grid(TAIL_M[-1:], (769,)), F32_BF16),
    Rows(FULL, "M tail", grid(TAIL_M + TAIL_M_FULL, TAIL_N), ALL),
    # Distributions: cancellation, zero variance, extreme magnitudes, NaN isolation.
    Rows(QUICK, "large_mean", grid((17,), DIST_N_QUICK), ALL, dist="large_mean"),
    Rows(FULL, "large_mean", grid((1025,), DIST_N_FULL), ALL, dist="large_mean"),
    Rows(QUICK, "constant", grid((17,), (1000, 4096)), ALL, dist="constant"),
    Rows(FULL, "constant", grid((1025,), (1000, 4096)), ALL, dist="constant"),
    Rows(QUICK, "offset", grid((17,), DIST_N_QUICK), ALL, dist="offset"),
    Rows(FULL, "offset", grid((1025,), DIST_N_FULL), ALL, dist="offset"),
    Rows(QUICK, "outlier_first", grid((17,), (1000, 4096)), ALL, dist="outlier_first"),
    Rows(FULL, "outlier_first", grid((1025,), (1000, 4096)), ALL, dist="outlier_first"),
    Rows(QUICK, "nan_row", grid((17,), (1000, 4096)), ALL, dist="nan_row"),
    Rows(FULL, "nan_row", grid((1025,), (1000, 4096)), ALL, dist="nan_row"),
    Rows(BOTH, "tiny", ((5, 4000),), ALL, dist="tiny"),
    Rows(BOTH, "huge", ((5, 4000),), ALL, dist="huge"),
    # An outlier first in long rows read one element at a time (a stride of N + 1): many values a
    # thread, the first of them the outlier (a GPU fuzz draw at float32 4 x 16384 found a long-row
    # kernel whose per-thread shift by its first value cancelled there).
    Rows(FULL, ("outlier_first", "long rows"), grid((4,), (16384, 65536)), F32_BF16, dist="outlier_first", row_pad=1),
    # A long constant float32 row whose N is not a multiple of any vector width: every rounding
    # of a running sum goes the same way, so a sum that accumulates in long sequential chains
    # drifts by about N * u (found by a drawn case in torch.compile's CPU code at N = 32764).
    Rows(BOTH, ("constant", "long rows"), ((1, 32764),), F32, dist="constant", affine="none", ops=("rms_norm",)),
    # eps: a large eps exposes an eps added outside the square root.
    Rows(BOTH, "eps", grid((9,), (1000, 4096)), F32_BF16, eps=1e-6),
    Rows(BOTH, "eps", grid((9,), (1000, 4096)), F32_BF16, eps=0.1),
    # Affine parameters: every combination the interface accepts (AFFINE), several dtypes and N.
    Rows(QUICK, "affine", ((7, 1000),), F32_BF16, affine="none"),
    Rows(QUICK, "affine", ((7, 1000),), F32_BF16, affine="weight"),
    Rows(QUICK, "affine", ((7, 1000),), F32_BF16, affine="bias"),
    *(Rows(FULL, "affine", grid((7,), (1000, 4096)), (dt,), affine=affine)
      for affine in ("none", "weight", "bias") for dt in ALL),
    # Layout: strided rows, 3-D input, one row, one column.
    *(Rows(BOTH, "strided rows", ((33, 1000), (5, 4097)), (dt,), row_pad=pad) for pad in (64, 1000) for dt in F32_BF16),
    Rows(QUICK, "3-D", ((2, 17, 1536), (4, 8, 4000)), F32_BF16),
    Rows(FULL, "3-D", ((2, 17, 1536), (4, 8, 4000), (8, 512, 4096)), F32_BF16),
    Rows(BOTH, "one row", ((1, 4096),), F32), Rows(BOTH, "one column", ((17, 1),), F32),
    Rows(BOTH, "one row", ((1, 4096),), F16), Rows(BOTH, "one column", ((17, 1),), F16),
    Rows(BOTH, "one row", ((1, 4096),), BF16), Rows(BOTH, "one column", ((17, 1),), BF16),
    # The shapes real models run; beyond 2**31 elements: 64-bit offsets.
    Rows(FULL, "model shape", ((16384, 4096), (16384, 4000), (32768, 1024), (4096, 8192), (2048, 65536)), ALL,
         dist="offset"),
    *(Rows(FULL, "beyond 2^31 elements", (shape,), dtypes) for shape, dtypes in HUGE_CASES),
)

# Backward cases: M tails for the dw/db reductions over rows, padded and odd N for the row sums
# of dx, every accepted weight/bias combination, large-mean rows, dy with outliers and exact
# zeros, strided rows. ``quick`` (CPU, CI): 17 RMSNorm, 18 LayerNorm cases; ``full``: 127 and 130.
BACKWARD_ROWS = (
    # M: tails of any rows-per-block choice; beyond 65536 rows (float32 only: a 16-bit dw's ulp
    # there is a row's size, see harness.judging.compare_backward), at a padded N and a power of two:
    # ~2^26 elements (the float64 oracle: GBs).
    *quick_and_full(BwdRows, "M tail", grid(BACKWARD_TAIL_M, (769,)), F32,
                    grid(BACKWARD_TAIL_M + BACKWARD_TAIL_M_FULL, TAIL_N)),
    BwdRows(FULL, "large M", grid((BACKWARD_LARGE_M,), (1000, 1024)), F32),
    # N: odd and padded lengths in the row sums of dx.
    *quick_and_full(BwdRows, "padded N", grid((17,), BACKWARD_N), BF16, grid((64,), BACKWARD_N + BACKWARD_N_FULL)),
    # Affine: every accepted combination (the weight-and-bias one is everywhere above).
    *(r for affine in ("none", "weight", "bias")
      for r in quick_and_full(BwdRows, "affine", ((17, 1000),), F32, affine=affine)),
    # Distributions of x and of dy.
    *quick_and_full(BwdRows, "large_mean", ((17, 4097),), F32_BF16, dist="large_mean"),
    *quick_and_full(BwdRows, "dy outliers", ((65, 1000),), F32, ((1025, 1000),), dy_dist="outliers"),
    *quick_and_full(BwdRows, "dy zeros", ((17, 1000),), F32, dy_dist="zeros"),
    BwdRows(BOTH, "offset", ((17, 4000),), F16, dist="offset"),
    # Layout: strided rows of x and dy; 3-D input.
    BwdRows(BOTH, "strided rows", ((33, 1000),), BF16, row_pad=64),
    BwdRows(FULL, "3-D", ((4, 8, 4000),), F32), BwdRows(FULL, "dy outliers", ((4097, 4000),), F32, dy_dist="outliers"),
    BwdRows(FULL, "3-D", ((4, 8, 4000),), F16), BwdRows(FULL, "dy outliers", ((4097, 4000),), F16, dy_dist="outliers"),
    BwdRows(FULL, "3-D", ((4, 8, 4000),), BF16), BwdRows(FULL, "dy outliers", ((4097, 4000),), BF16, dy_dist="outliers"),
)


def catalogue(profile: str = "quick", rows: tuple[Rows, ...] = FORWARD_ROWS) -> list[Case]:
    """The profile's cases, the table's rows that name it expanded, without duplicates (a case of
    several rows carries every row's tags), in a stable order."""
    if profile not in ("quick", "full"):
        raise ValueError(f"unknown profile {profile!r}; expected quick or full")
    seen: dict[str, Case] = {}
    for case in (c for row in rows if profile in row.profiles for c in row.cases()):
        old = seen.get(case.id)
        seen[case.id] = case if old is None else replace(old, tags=tuple(dict.fromkeys(old.tags + case.tags)))
    return list(seen.values())


def backward_catalogue(profile: str = "quick") -> list[Case]:
    """The profile's backward cases (BACKWARD_ROWS), without duplicates, in a stable order."""
    return catalogue(profile, BACKWARD_ROWS)


def case_from_id(case_id: str) -> Case:
    """Inverse of Case.id, for rebuilding a failing case's inputs outside pytest."""
    return case_ids.from_id(Case, case_id)


__all__ = ["Case", "catalogue", "backward_catalogue", "case_from_id"]
