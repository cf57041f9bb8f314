"""Tolerance policy and error statistics.

Each output is compared separately with the float64 oracle. An element passes when

    |out - ref| <= ULPS[dtype] * ulp_dtype(ref) + FLOOR[dtype] * scale_row

- ``ulp_dtype(ref)`` is the spacing of the output dtype at the reference value: rounding the
  exact result to the output dtype costs half of one; a kernel that rounds an intermediate costs
  about one more.
- ``scale_row`` is the size of what the row's arithmetic cancels, in units of the output:
  for LayerNorm's y it is max|w| * (1 + |mean| * rstd), because an error d in a float32 mean
  moves y by d * rstd; for RMSNorm's y it is max|w|. For ordinary rows it is about 1, so the floor
  is an absolute tolerance; for rows whose mean is 1e4 standard deviations from zero it grows
  with the conditioning, as the error of any correct float32 kernel does.
- The statistics are float32 (or the precision the kernel declares it computes them in). A
  stable variance (two-pass, Welford, Chan's merge) errs by about u * cond relative, with
  cond = 1 + |mean| * rstd, so rstd's floor scales with cond; the textbook E[x^2] - E[x]^2 errs
  by about u * cond**2 and fails.

For ordinary data this is stricter than assert_close with atol=rtol=1e-4 (float32) and
atol=rtol=1e-2 (float16, bfloat16): one bfloat16 ulp is at most 2**-7 |v|.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}

# y: ulps of the output dtype, and the absolute floor (times scale_row).
Y_ULPS = {torch.float32: 64, torch.float16: 1, torch.bfloat16: 1}
Y_FLOOR = {torch.float32: 2e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}
# mean and rstd: ulps of the precision the statistics are computed in, and a relative floor.
STAT_ULPS = {torch.float32: 64, torch.float16: 1, torch.bfloat16: 1}
STAT_FLOOR = {torch.float32: 2e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at each value of ``ref`` (float64), subnormals included."""
    fi = torch.finfo(dtype)
    mag = ref.abs().clamp(min=fi.tiny)
    exponent = torch.floor(torch.log2(mag))
    return torch.exp2(exponent - MANTISSA_BITS[dtype])


@dataclass
class ErrorStats:
    """How far one output is from the oracle; recorded whether the case passed or not."""

    output: str
    max_abs: float
    max_ulp: float  # largest |out - ref| in ulps of the compared dtype
    rel_l2: float  # ||out - ref|| / ||ref|| over finite reference values
    worst_ratio: float  # largest |out - ref| / allowed; > 1 fails
    mismatched: int  # elements over tolerance, NaN where the oracle is finite, or the reverse
    numel: int
    worst_index: tuple[int, ...] | None = None
    worst_out: float | None = None
    worst_ref: float | None = None
    # rel_l2's numerator and denominator, for merging chunks (merge); not reported
    err_l2: float = field(default=0.0, repr=False, compare=False)
    ref_l2: float = field(default=0.0, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.mismatched == 0

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("err_l2", "ref_l2")}

    def summary(self) -> str:
        where = ""
        if self.worst_index is not None:
            where = f" worst at {list(self.worst_index)}: got {self.worst_out:.9g}, expected {self.worst_ref:.9g}"
        return (
            f"{self.output}: {self.mismatched}/{self.numel} elements out of tolerance, "
            f"max abs err {self.max_abs:.3g}, max ulp err {self.max_ulp:.3g}, rel L2 {self.rel_l2:.3g}, "
            f"{self.worst_ratio:.3g}x the allowed error;{where}"
        )


def compare(
    output: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype,
    allowed_floor: torch.Tensor | float,
    ulps: float,
) -> ErrorStats:
    """Compare ``out`` with float64 ``ref``; allowed = ulps * ulp_dtype(ref) + allowed_floor.

    The reported ulp error covers the elements where the ulp term is the larger part of the
    allowance; near zero (and in ill-conditioned rows) the floor governs, and an error in ulps
    of a tiny value says nothing."""
    o = out.detach().double()
    r = ref.detach().double()
    if not r.numel():
        return ErrorStats(output=output, max_abs=0.0, max_ulp=0.0, rel_l2=0.0, worst_ratio=0.0, mismatched=0, numel=0)
    ref_nan = torch.isnan(r)
    nan_mismatch = torch.isnan(o) != ref_nan
    both = ~ref_nan & ~torch.isnan(o)
    err = torch.where(both, (o - r).abs(), torch.zeros_like(r))
    # An infinite reference must be matched exactly (inf - inf is NaN: count it separately).
    inf_mismatch = both & torch.isinf(r) & (o != r)
    err = torch.where(torch.isinf(r) | torch.isinf(o), torch.where(o == r, 0.0, math.inf), err)
    u = ulp(r, dtype)
    ulp_governs = ulps * u >= allowed_floor
    allowed = ulps * u + allowed_floor
    ratio = torch.where(both, err / allowed, torch.zeros_like(r))
    bad = nan_mismatch | inf_mismatch | (ratio > 1)
    finite_ref = torch.isfinite(r)
    score = torch.where(nan_mismatch | inf_mismatch, math.inf, ratio)
    flat = torch.argmax(score).reshape(1)
    # Every statistic in one float64 vector, read back with one synchronisation (a check's
    # comparisons otherwise wait on the GPU dozens of times, which the processes sharing it pay).
    values = torch.cat([
        torch.stack([
            err.max(),
            torch.where(both & ulp_governs, err / u, 0.0).max(),
            score.max(),
            bad.sum().double(),
            torch.linalg.vector_norm(torch.where(finite_ref & both, o - r, 0.0)),
            torch.linalg.vector_norm(torch.where(finite_ref, r, 0.0)),
            bad.any().double(),
        ]),
        flat.double(), bad.reshape(-1)[flat].double(), o.reshape(-1)[flat], r.reshape(-1)[flat],
    ]).tolist()
    max_abs, max_ulp, worst_ratio, mismatched, num, den, any_bad, flat_i, bad_at, worst_out, worst_ref = values
    worst = None
    if bad_at or not any_bad:
        worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(int(flat_i)), r.shape))
    return ErrorStats(
        output=output,
        max_abs=float(max_abs),
        max_ulp=float(max_ulp),
        rel_l2=num / den if den > 0 else (0.0 if num == 0 else math.inf),
        worst_ratio=float(worst_ratio),
        mismatched=int(mismatched),
        numel=r.numel(),
        worst_index=worst,
        worst_out=float(worst_out) if worst is not None else None,
        worst_ref=float(worst_ref) if worst is not None else None,
        err_l2=num,
        ref_l2=den,
    )


def merge(parts: list[tuple[int, ErrorStats]]) -> ErrorStats:
    """One output's statistics over row chunks, from each chunk's (first row, statistics): as
    ``compare`` over the whole would give them (the worst element: the first of the largest ratio)."""
    stats = [s for _, s in parts]
    first, top = max(parts, key=lambda p: p[1].worst_ratio)  # max keeps the first of equals
    num = math.sqrt(sum(s.err_l2**2 for s in stats))
    den = math.sqrt(sum(s.ref_l2**2 for s in stats))
    worst = None if top.worst_index is None else (top.worst_index[0] + first, *top.worst_index[1:])
    return ErrorStats(
        output=top.output,
        max_abs=max(s.max_abs for s in stats),
        max_ulp=max(s.max_ulp for s in stats),
        rel_l2=num / den if den > 0 else (0.0 if num == 0 else math.inf),
        worst_ratio=top.worst_ratio,
        mismatched=sum(s.mismatched for s in stats),
        numel=sum(s.numel for s in stats),
        worst_index=worst,
        worst_out=top.worst_out,
        worst_ref=top.worst_ref,
        err_l2=num,
        ref_l2=den,
    )


def row_scale(op: str, ref_mean, ref_rstd, weight) -> torch.Tensor:
    """scale_row of the module docstring, shape (..., 1), float64; NaN rows get 1."""
    # a 0-d tensor, not a float: reading it back would wait on the GPU
    wmax = 1.0 if weight is None else weight.double().abs().max().clamp(min=1e-30)
    if op == "layer_norm":
        cond = 1.0 + (ref_mean.abs() * ref_rstd)
    else:
        cond = torch.ones_like(ref_rstd)
    cond = torch.nan_to_num(cond, nan=1.0, posinf=1.0)
    return (wmax * cond).unsqueeze(-1)


def y_floor(op: str, ref, x_dtype: torch.dtype, weight) -> torch.Tensor:
    """The absolute part of y's allowance: FLOOR[dtype] * scale_row, shape (..., 1)."""
    return Y_FLOOR[x_dtype] * row_scale(op, ref.mean, ref.rstd, weight)


def y_allowance(op: str, ref, x_dtype: torch.dtype, weight, extra: torch.Tensor | None = None) -> torch.Tensor:
    """The error allowed in each element of y (float64, y's shape)."""
    allowed = Y_ULPS[x_dtype] * ulp(ref.y, x_dtype) + y_floor(op, ref, x_dtype, weight)
    return allowed if extra is None else allowed + extra


def rounding_allowance(rounding: str, op: str, x, ref, weight, bias, x_dtype: torch.dtype) -> torch.Tensor | None:
    """What a kernel's declared rounding contract adds to y's allowance (None: nothing).

    "once": y is computed in float32 and rounded once to x's dtype; nothing is added.
    "before_affine": the normalised x^ is rounded to x's dtype before the weight multiply, and
    x^ * w again before the bias is added (apex's kernels; HF-style modules do the same). Each
    rounding costs half an ulp of that intermediate, which can be far larger than an ulp of y
    (|w| > 1, or a bias cancelling x^ * w), so it is allowed exactly, and only that."""
    if rounding == "once" or weight is None or x_dtype == torch.float32:
        return None
    if rounding != "before_affine":
        raise ValueError(f"unknown rounding contract {rounding!r}")
    x64 = x.double()
    rstd = ref.rstd.unsqueeze(-1)
    xhat = (x64 - ref.mean.unsqueeze(-1)) * rstd if op == "layer_norm" else x64 * rstd
    w = weight.double()
    extra = 0.5 * ulp(xhat, x_dtype) * w.abs()
    if bias is not None:
        extra = extra + 0.5 * ulp(xhat * w, x_dtype)
    return torch.nan_to_num(extra, nan=0.0, posinf=0.0)


def compare_outputs(op: str, outputs, ref, x_dtype: torch.dtype, stat_dtype: torch.dtype, weight,
                    y_extra: torch.Tensor | None = None) -> list[ErrorStats]:
    """Every output the kernel produced, each against the oracle with its own tolerance
    (``y_extra``: what the kernel's rounding contract adds to y's, see rounding_allowance)."""
    cond = row_scale(op, ref.mean, ref.rstd, None).squeeze(-1)
    y_abs = y_floor(op, ref, x_dtype, weight)
    if y_extra is not None:
        y_abs = y_abs + y_extra
    stats = [compare("y", outputs.y, ref.y, x_dtype, y_abs, Y_ULPS[x_dtype])]
    for name in ("mean", "rstd"):
        got, want = getattr(outputs, name), getattr(ref, name)
        if got is None or want is None:
            continue
        stats.append(compare(name, got, want, stat_dtype, stat_floor(name, op, ref, stat_dtype, cond), STAT_ULPS[stat_dtype]))
    return stats


def stat_floor(name: str, op: str, ref, stat_dtype: torch.dtype, cond: torch.Tensor | None = None) -> torch.Tensor:
    """The absolute part of mean's or rstd's allowance (float64, one per row)."""
    want = getattr(ref, name)
    if name == "mean":  # error of a float32 sum: relative to the row's spread and offset
        return STAT_FLOOR[stat_dtype] * (want.abs() + 1.0 / ref.rstd).nan_to_num(nan=0.0)
    cond = row_scale(op, ref.mean, ref.rstd, None).squeeze(-1) if cond is None else cond
    # a stable variance (two-pass, Welford, Chan) errs by about u * cond relative
    return STAT_FLOOR[stat_dtype] * (want.abs() * cond).nan_to_num(nan=0.0)


def stat_allowance(name: str, op: str, ref, stat_dtype: torch.dtype) -> torch.Tensor:
    """The error allowed in each row's mean or rstd (float64), as compare_outputs allows it."""
    return STAT_ULPS[stat_dtype] * ulp(getattr(ref, name), stat_dtype) + stat_floor(name, op, ref, stat_dtype)


class AgreementScales:
    """The allowances one case's agreement comparisons divide by, computed once per case (every
    pair of kernels that ran it divides by the same ones): y's without any rounding contract's
    extra, and each statistic's per statistics dtype."""

    def __init__(self, op: str, ref, x_dtype: torch.dtype, weight):
        self.op, self.ref, self.x_dtype, self.weight = op, ref, x_dtype, weight
        self._y = None
        self._stats: dict = {}

    def y(self, extra: torch.Tensor | None) -> torch.Tensor:
        if self._y is None:
            self._y = y_allowance(self.op, self.ref, self.x_dtype, self.weight)
        return self._y if extra is None else self._y + extra

    def stat(self, name: str, stat_dtype: torch.dtype) -> torch.Tensor:
        key = (name, stat_dtype)
        if key not in self._stats:
            self._stats[key] = stat_allowance(name, self.op, self.ref, stat_dtype)
        return self._stats[key]


def agreement(op: str, ref, x_dtype: torch.dtype, weight, a: tuple, b: tuple) -> tuple[float, str]:
    """How far two kernels' outputs on the same inputs are apart, in units of the allowed error
    (1: as far as either may be from the oracle), over y and the statistics both wrote; and the
    output where they are furthest apart. ``a`` and ``b``: (outputs, y's extra allowance, stat dtype)."""
    return agreements(AgreementScales(op, ref, x_dtype, weight), a, {"b": b})["b"]


def agreements(scales: AgreementScales, mine: tuple, others: dict) -> dict:
    """``agreement`` of ``mine`` with each of ``others`` (name -> (outputs, extra, stat dtype)),
    as name -> (difference, output furthest apart), read back from the GPU at once."""
    oa, ea, sa = mine
    parts, labels = [], []
    for name, (ob, eb, sb) in others.items():
        extras = [e for e in (ea, eb) if e is not None]  # a looser rounding contract widens y's allowance
        extra = torch.maximum(*extras) if len(extras) == 2 else (extras[0] if extras else None)
        parts.append(distance_tensor(oa.y, ob.y, scales.y(extra)))
        labels.append((name, "y"))
        for stat in ("mean", "rstd"):
            ta, tb = getattr(oa, stat), getattr(ob, stat)
            if ta is None or tb is None or getattr(scales.ref, stat) is None:
                continue
            allowed = torch.maximum(scales.stat(stat, sa), scales.stat(stat, sb))
            parts.append(distance_tensor(ta.reshape(-1), tb.reshape(-1), allowed.reshape(-1)))
            labels.append((name, stat))
    found: dict = {}
    for (name, output), d in zip(labels, torch.stack(parts).tolist() if parts else []):
        found[name] = max(found.get(name, (d, output)), (d, output))
    return found


def distance_tensor(a: torch.Tensor, b: torch.Tensor, allowance: torch.Tensor) -> torch.Tensor:
    """``distance`` as a 0-d float64 tensor, computed without waiting on the GPU."""
    if not a.numel():
        return torch.zeros((), dtype=torch.float64, device=a.device)
    a64, b64 = a.double(), b.double()
    na, nb = torch.isnan(a64), torch.isnan(b64)
    d = torch.where(a64 == b64, 0.0, (a64 - b64).abs() / allowance)
    d = torch.where(na & nb, 0.0, d)  # NaN in both: agreement
    return torch.where(na != nb, math.inf, d).max()  # NaN in one only: infinitely apart


def distance(a: torch.Tensor, b: torch.Tensor, allowance: torch.Tensor) -> float:
    """Largest difference between two kernels' outputs in units of the allowed error (so 1 means
    they differ by as much as either may err); NaN-pattern differences count as infinite."""
    return float(distance_tensor(a, b, allowance).item())
