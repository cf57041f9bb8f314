"""The case catalogue: plain values, generated from a few declarative tables.

A Case says everything needed to rebuild its inputs bit for bit (the seed is derived from its id),
so a failure reproduces from the pytest id alone. Profiles pick subsets: ``quick`` for CPU and
CI, ``full`` for a GPU.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

import torch

from harness.shapes import (BACKWARD_LARGE_M, BACKWARD_N, BACKWARD_N_FULL, BACKWARD_TAIL_M, BACKWARD_TAIL_M_FULL,
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
    dist: str = "normal"  # see make_x
    eps: float | None = None  # None: the op's default
    affine: str = "weight_bias"  # one of AFFINE; rms_norm has no bias ("bias" is LayerNorm's only)
    row_pad: int = 0  # extra elements between rows of x (strided rows)
    dy_dist: str | None = None  # a backward case: the distribution of dy (see make_dy); None: forward
    tags: tuple[str, ...] = field(default=(), compare=False)  # why the case is in the catalogue

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
        parts = [self.op, self.dtype, "x".join(map(str, self.shape)), self.dist]
        if self.eps is not None:
            parts.append(f"eps{self.eps:g}")
        if self.affine != "weight_bias":
            parts.append(AFFINE_ID[self.affine])
        if self.row_pad:
            parts.append(f"stride{self.n + self.row_pad}")
        if self.dy_dist is not None:
            parts.append(f"dy{self.dy_dist}")
        return "-".join(parts)

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


@dataclass
class Inputs:
    x: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    storage: torch.Tensor  # x with the padding between its rows

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"x": self.storage, "weight": self.weight, "bias": self.bias}
        return {k: v for k, v in named.items() if v is not None}


def make_inputs(case: Case, device: str | torch.device = "cpu") -> Inputs:
    """Deterministic inputs for a case, drawn on ``device`` from a seed derived from the case id
    (the same bits on every run on the same kind of device)."""
    gen = torch.Generator(device=device).manual_seed(case.seed)
    dtype = case.torch_dtype
    lead, n = case.shape[:-1], case.n
    storage = make_x(case.dist, (*lead, n + case.row_pad), dtype, gen)
    x = storage[..., :n]
    weight = bias = None
    if case.has_weight:  # weights away from one, some negative: an ignored weight shows
        weight = (1.0 + 0.5 * torch.randn(n, generator=gen, device=gen.device)).to(dtype)
    if case.has_bias:
        bias = (0.5 * torch.randn(n, generator=gen, device=gen.device)).to(dtype)
    return Inputs(x=x, weight=weight, bias=bias, eps=case.eps_value, storage=storage)


def make_dy(case: Case, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of y for a backward case: (dy, its storage), dy with x's shape, dtype and row
    stride (strided rows in both), from the case's dy_seed.

    - "normal": standard normal;
    - "outliers": one row (the middle one) 100 times larger, and every 97th element 10 times:
      a row dw and db must not drop, and row sums a large element must not swamp (float16's
      range holds them, and dw over them);
    - "zeros": about half the elements exactly zero, and the first row and column all zero
      (dw and db of that column are exactly zero)."""
    gen = torch.Generator(device=device).manual_seed(case.dy_seed)
    lead, n = case.shape[:-1], case.n
    dy = torch.randn((*lead, n + case.row_pad), generator=gen, dtype=torch.float64, device=gen.device)
    flat = dy.view(-1, n + case.row_pad)
    if case.dy_dist == "outliers":
        flat.view(-1)[::97] *= 10
        flat[flat.shape[0] // 2] *= 100
    elif case.dy_dist == "zeros":
        flat.mul_(torch.rand(flat.shape, generator=gen, dtype=torch.float64, device=gen.device) < 0.5)
        flat[0] = 0
        flat[:, 0] = 0
    elif case.dy_dist != "normal":
        raise ValueError(f"unknown dy distribution {case.dy_dist!r}")
    storage = dy.to(case.torch_dtype)
    return storage[..., :n], storage


# A "normal" x larger than this is drawn in row chunks (its float64 draw would take GBs); every
# catalogue case but the HUGE_CASES is within it, so their bits do not depend on the chunking.
DRAW_CHUNK_ELEMENTS = 2**27


def make_x(dist: str, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    finfo = torch.finfo(dtype)
    dev = gen.device
    if dist == "normal" and math.prod(shape) > DRAW_CHUNK_ELEMENTS:
        x = torch.empty(shape, dtype=dtype, device=dev)
        flat = x.view(-1, shape[-1])
        step = max(1, DRAW_CHUNK_ELEMENTS // shape[-1])
        for start in range(0, flat.shape[0], step):
            part = flat[start:start + step]
            part.copy_(torch.randn(part.shape, generator=gen, dtype=torch.float64, device=dev))
        return x
    normal = lambda: torch.randn(shape, generator=gen, dtype=torch.float64, device=dev)  # noqa: E731
    if dist == "normal":
        x = normal()
    elif dist == "offset":  # mean and scale vary per row
        lead = (*shape[:-1], 1)
        x = normal() * torch.rand(lead, generator=gen, dtype=torch.float64, device=dev) * 4 + torch.randn(
            lead, generator=gen, dtype=torch.float64, device=dev
        ) * 3
    elif dist == "large_mean":
        # mean 1e4 and a spread of a few ulps at that magnitude: E[x^2]-E[x]^2 cancels.
        x = 1e4 + normal() * max(1.0, 1e4 * finfo.eps)
    elif dist == "constant":  # variance exactly zero; each row its own value
        x = torch.randn((*shape[:-1], 1), generator=gen, dtype=torch.float64, device=dev).expand(shape).clone() * 2
    elif dist == "tiny":  # squares underflow a half-precision accumulator
        x = normal() * (1e-4 if dtype == torch.float16 else 1e-12)
    elif dist == "huge":  # squares overflow a half-precision accumulator, not a float32 one
        x = normal() * (1e4 if dtype == torch.float16 else 1e12)
    elif dist == "outlier_first":  # the row's first element far out: a shift by x[row, 0] then
        # leaves E[s^2] - E[s]^2 to cancel (a cheap guard against large means, wrong here)
        x = normal()
        x[..., 0] = 8 * shape[-1] ** 0.5
    elif dist == "nan_row":  # one NaN in one row: that row's outputs are NaN, no other row's
        x = normal()
        flat = x.view(-1, shape[-1])
        flat[flat.shape[0] // 2, shape[-1] // 3] = float("nan")
    else:
        raise ValueError(f"unknown distribution {dist!r}")
    return x.to(dtype)


# -- profiles ---------------------------------------------------------------------------------
def _both_ops(**kw) -> list[Case]:
    return [Case(op=op, **kw) for op in ("rms_norm", "layer_norm")]


def _catalogue(profile: str) -> list[Case]:
    full = profile == "full"
    all_dtypes = tuple(DTYPES)
    cases: list[Case] = []
    add = cases.extend

    # Row length N: odd sizes and powers of two (padding must not enter the statistics).
    m_sweep = 64 if full else 3
    for n in sorted(set(ODD_N + POW2_N)):
        for dt in all_dtypes if (full or n in ODD_N) else ("bfloat16",):
            add(_both_ops(dtype=dt, shape=(m_sweep, n), tags=("padded N",)))
    for n in CHECK_LONG_N if full else CHECK_LONG_N_QUICK:
        add(_both_ops(dtype="bfloat16", shape=(2, n), tags=("long rows",)))
        if full:
            add(_both_ops(dtype="float32", shape=(2, n), tags=("long rows",)))

    # Row count M: tails of any rows-per-program choice. The quick profile runs its largest tail
    # (1025 rows: several programs of any rows-per-program) at the shorter N only: interpreted
    # Triton spent 12 s a kernel on each 1025 x 4000 case in CI, for a tail 1025 x 769 also has.
    for m in TAIL_M + (TAIL_M_FULL if full else ()):
        if full:
            tail_n = (769, 4000, 4096, 8192)
        else:
            tail_n = (769,) if m == max(TAIL_M) else (769, 4000)
        for n in tail_n:
            for dt in ("float32", "bfloat16") if not full else all_dtypes:
                add(_both_ops(dtype=dt, shape=(m, n), tags=("M tail",)))

    # Distributions: cancellation, zero variance, extreme magnitudes, NaN isolation.
    dist_n = (129, 1000, 4000, 4097) if not full else (129, 1000, 4000, 4096, 4097, 12345, 65536)
    for dist in ("large_mean", "constant", "offset", "outlier_first", "nan_row"):
        for n in dist_n if dist in ("large_mean", "offset") else (1000, 4096):
            for dt in all_dtypes:
                add(_both_ops(dtype=dt, shape=(17 if not full else 1025, n), dist=dist, tags=(dist,)))
    for dist in ("tiny", "huge"):
        for dt in all_dtypes:
            add(_both_ops(dtype=dt, shape=(5, 4000), dist=dist, tags=(dist,)))
    # An outlier first in long rows read one element at a time (a stride of N + 1): many values a
    # thread, the first of them the outlier (a GPU fuzz draw at float32 4 x 16384 found a long-row
    # kernel whose per-thread shift by its first value cancelled there).
    if full:
        for n in (16384, 65536):
            for dt in ("float32", "bfloat16"):
                add(_both_ops(dtype=dt, shape=(4, n), dist="outlier_first", row_pad=1,
                              tags=("outlier_first", "long rows")))
    # A long constant float32 row whose N is not a multiple of any vector width: every rounding
    # of a running sum goes the same way, so a sum that accumulates in long sequential chains
    # drifts by about N * u (found by a drawn case in torch.compile's CPU code at N = 32764).
    cases.append(Case(op="rms_norm", dtype="float32", shape=(1, 32764), dist="constant", affine="none",
                      tags=("constant", "long rows")))

    # eps: a large eps exposes an eps added outside the square root.
    for eps in (1e-6, 0.1):
        for n in (1000, 4096):
            for dt in ("float32", "bfloat16"):
                add(_both_ops(dtype=dt, shape=(9, n), eps=eps, tags=("eps",)))

    # Affine parameters: every combination the interface accepts (AFFINE), several dtypes and N.
    for affine in ("none", "weight", "bias"):
        for dt in all_dtypes if full else ("float32", "bfloat16"):
            for n in (1000, 4096) if full else (1000,):
                add([Case(op=op, dtype=dt, shape=(7, n), affine=affine, tags=("affine",))
                     for op in ("rms_norm", "layer_norm") if op == "layer_norm" or affine != "bias"])

    # Layout: strided rows, 3-D input, one row, one column.
    for pad in (64, 1000):
        for dt in ("float32", "bfloat16"):
            add(_both_ops(dtype=dt, shape=(33, 1000), row_pad=pad, tags=("strided rows",)))
            add(_both_ops(dtype=dt, shape=(5, 4097), row_pad=pad, tags=("strided rows",)))
    for shape in ((2, 17, 1536), (4, 8, 4000)) + (((8, 512, 4096),) if full else ()):
        for dt in ("float32", "bfloat16"):
            add(_both_ops(dtype=dt, shape=shape, tags=("3-D",)))
    for dt in all_dtypes:
        add(_both_ops(dtype=dt, shape=(1, 4096), tags=("one row",)))
        add(_both_ops(dtype=dt, shape=(17, 1), tags=("one column",)))

    if full:  # the shapes real models run
        for shape in ((16384, 4096), (16384, 4000), (32768, 1024), (4096, 8192), (2048, 65536)):
            for dt in all_dtypes:
                add(_both_ops(dtype=dt, shape=shape, dist="offset", tags=("model shape",)))
        for shape, dtypes in HUGE_CASES:  # beyond 2**31 elements: 64-bit offsets
            for dt in dtypes:
                add(_both_ops(dtype=dt, shape=shape, tags=("beyond 2^31 elements",)))
    return cases


def _backward_catalogue(profile: str) -> list[Case]:
    """Backward cases (dy_dist set): M tails for the dw/db reductions over rows, padded and odd N
    for the row sums of dx, every accepted weight/bias combination, large-mean rows, dy with
    outliers and exact zeros, strided rows. ``quick`` (CPU, CI): 17 RMSNorm, 18 LayerNorm cases; ``full``: 127 and 130."""
    full = profile == "full"
    all_dtypes = tuple(DTYPES)
    cases: list[Case] = []
    add = cases.extend
    bwd = lambda **kw: _both_ops(**{"dy_dist": "normal", **kw})  # noqa: E731
    # M: tails of any rows-per-block choice; beyond 65536 rows (float32 only: a 16-bit dw's ulp
    # there is a row's size, see harness.compare_backward).
    for m in BACKWARD_TAIL_M + (BACKWARD_TAIL_M_FULL if full else ()):
        for n in (769,) if not full else (769, 4000, 4096, 8192):
            for dt in ("float32",) if not full else all_dtypes:
                add(bwd(dtype=dt, shape=(m, n), tags=("M tail",)))
    if full:
        for n in (1000, 1024):  # padded and a power of two; ~2^26 elements (the float64 oracle: GBs)
            add(bwd(dtype="float32", shape=(BACKWARD_LARGE_M, n), tags=("large M",)))
    # N: odd and padded lengths in the row sums of dx.
    for n in BACKWARD_N + (BACKWARD_N_FULL if full else ()):
        for dt in ("bfloat16",) if not full else all_dtypes:
            add(bwd(dtype=dt, shape=(17 if not full else 64, n), tags=("padded N",)))
    # Affine: every accepted combination (the weight-and-bias one is everywhere above).
    for affine in ("none", "weight", "bias"):
        for dt in ("float32",) if not full else all_dtypes:
            add([Case(op=op, dtype=dt, shape=(17, 1000), affine=affine, dy_dist="normal", tags=("affine",))
                 for op in ("rms_norm", "layer_norm") if op == "layer_norm" or affine != "bias"])
    # Distributions of x and of dy.
    for dt in ("float32", "bfloat16") if not full else all_dtypes:
        add(bwd(dtype=dt, shape=(17, 4097), dist="large_mean", tags=("large_mean",)))
    for dy_dist, m in (("outliers", 1025 if full else 65), ("zeros", 17)):
        for dt in ("float32",) if not full else all_dtypes:
            add(bwd(dtype=dt, shape=(m, 1000), dy_dist=dy_dist, tags=(f"dy {dy_dist}",)))
    add(bwd(dtype="float16", shape=(17, 4000), dist="offset", tags=("offset",)))
    # Layout: strided rows of x and dy.
    add(bwd(dtype="bfloat16", shape=(33, 1000), row_pad=64, tags=("strided rows",)))
    if full:
        for dt in all_dtypes:
            add(bwd(dtype=dt, shape=(4, 8, 4000), tags=("3-D",)))
            add(bwd(dtype=dt, shape=(4097, 4000), dy_dist="outliers", tags=("dy outliers",)))
    return cases


def backward_catalogue(profile: str = "quick") -> list[Case]:
    """The profile's backward cases, without duplicates, in a stable order."""
    return catalogue(profile, _backward_catalogue)


def catalogue(profile: str = "quick", source=None) -> list[Case]:
    """The profile's cases, without duplicates, in a stable order."""
    if profile not in ("quick", "full"):
        raise ValueError(f"unknown profile {profile!r}; expected quick or full")
    seen: dict[str, Case] = {}
    for case in (source or _catalogue)(profile):
        if case.id in seen:
            old = seen[case.id]
            seen[case.id] = Case(**{**old.__dict__, "tags": tuple(dict.fromkeys(old.tags + case.tags))})
        else:
            seen[case.id] = case
    return list(seen.values())


_ID = re.compile(
    r"(?P<op>[a-z_]+)-(?P<dtype>[a-z0-9]+)-(?P<shape>[0-9x]+)-(?P<dist>[a-z_]+)"
    r"(?:-eps(?P<eps>[0-9.e+-]+?))?(?:-(?P<affine>noaffine|weightonly|biasonly))?(?:-stride(?P<stride>[0-9]+))?"
    r"(?:-dy(?P<dy>[a-z_]+))?$"
)


def case_from_id(case_id: str) -> Case:
    """Inverse of Case.id, for rebuilding a failing case's inputs outside pytest."""
    m = _ID.match(case_id)
    if not m:
        raise ValueError(f"not a case id: {case_id!r}")
    shape = tuple(int(s) for s in m["shape"].split("x"))
    return Case(
        op=m["op"],
        dtype=m["dtype"],
        shape=shape,
        dist=m["dist"],
        eps=float(m["eps"]) if m["eps"] else None,
        affine={v: k for k, v in AFFINE_ID.items()}.get(m["affine"], "weight_bias"),
        row_pad=int(m["stride"]) - shape[-1] if m["stride"] else 0,
        dy_dist=m["dy"],
    )


__all__ = ["Case", "Inputs", "catalogue", "backward_catalogue", "case_from_id", "make_inputs", "make_dy"]
