'''The judging code a repro carries, as source text: the float64 reference, the allowance and the
comparison of harness/judging/compare.py, compare_backward.py and compare_fused.py, written out
with the constants those modules hold (``constants``) so that a file prints the same worst error and
"x allowed" as the report. tests/test_repro.py holds a repro's numbers to the harness's.'''
from __future__ import annotations

import torch

from harness.judging import compare, compare_backward, compare_fused

COMMON = '''
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}


def ulp(ref, dtype):
    """Spacing of ``dtype`` at each value of float64 ``ref``, subnormals included."""
    mag = ref.abs().clamp(min=torch.finfo(dtype).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - MANTISSA_BITS[dtype])


def compare(name, out, ref, dtype, floor, ulps):
    """|out - ref| <= ulps * ulp(ref) + floor element by element; a NaN must meet a NaN, an
    infinity the same infinity. Returns what the report prints, and whether it failed."""
    o, r = out.detach().double(), ref.detach().double()
    if not r.numel():
        return f"{name}: 0/0 elements out of tolerance", False
    ref_nan = torch.isnan(r)
    nan_mismatch = torch.isnan(o) != ref_nan
    both = ~ref_nan & ~torch.isnan(o)
    err = torch.where(both, (o - r).abs(), torch.zeros_like(r))
    inf_mismatch = both & torch.isinf(r) & (o != r)
    err = torch.where(torch.isinf(r) | torch.isinf(o), torch.where(o == r, 0.0, math.inf), err)
    u = ulp(r, dtype)
    allowed = ulps * u + floor
    ratio = torch.where(both, err / allowed, torch.zeros_like(r))
    bad = nan_mismatch | inf_mismatch | (ratio > 1)
    score = torch.where(nan_mismatch | inf_mismatch, math.inf, ratio)
    flat = int(torch.argmax(score.reshape(-1)))
    finite = torch.isfinite(r)
    num = float(torch.linalg.vector_norm(torch.where(finite & both, o - r, 0.0)))
    den = float(torch.linalg.vector_norm(torch.where(finite, r, 0.0)))
    max_ulp = float(torch.where(both & (ulps * u >= floor), err / u, 0.0).max())
    return summary(name, int(bad.sum()), r.numel(), float(err.max()), max_ulp,
                   num / den if den > 0 else (0.0 if num == 0 else math.inf), float(score.max()), r.shape, flat,
                   o.reshape(-1)[flat], r.reshape(-1)[flat], bool(bad.reshape(-1)[flat]) or not bool(bad.any()))


def summary(name, mismatched, numel, max_abs, max_ulp, rel_l2, worst_ratio, shape, flat, got, want, show):
    where = ""
    if show:
        index = [int(i) for i in torch.unravel_index(torch.tensor(flat), shape)]
        where = f" worst at {index}: got {float(got):.9g}, expected {float(want):.9g}"
    return (f"{name}: {mismatched}/{numel} elements out of tolerance, max abs err {max_abs:.3g}, max ulp err "
            f"{max_ulp:.3g}, rel L2 {rel_l2:.3g}, {worst_ratio:.3g}x the allowed error;{where}"), mismatched > 0


def rows_of(t):
    """(..., N) as 2-D rows with one row stride, a view where it can be (as the harness's call)."""
    n = t.shape[-1]
    m = t.numel() // n if n else 0
    if t.dim() == 1:
        return t.view(1, n)
    if m <= 1:
        return t.reshape(m, n) if m == 0 else t.as_strided((1, n), (max(n, t.stride(-2)), 1))
    sizes, strides = t.shape[:-1], t.stride()[:-1]
    if all(strides[i] == strides[i + 1] * sizes[i + 1] or sizes[i] == 1 for i in range(len(sizes) - 1)) \\
            and strides[-1] >= n:
        return t.as_strided((m, n), (strides[-1], 1))
    return t.reshape(m, n).contiguous()
'''

REFERENCE = '''
def reference(op, x, weight=None, bias=None, eps=None):
    """y, mean and rstd in float64 on the low-precision inputs (y neither rounded nor scaled)."""
    x64 = x.double()
    mean = None
    if op == "layer_norm":
        mean = x64.mean(dim=-1)
        var = ((x64 - mean.unsqueeze(-1)) ** 2).mean(dim=-1)  # two passes: no cancellation
        rstd = 1.0 / torch.sqrt(var + eps)
        y = (x64 - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    else:
        rstd = 1.0 / torch.sqrt((x64 * x64).mean(dim=-1) + eps)
        y = x64 * rstd.unsqueeze(-1)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y, mean, rstd


def row_scale(op, mean, rstd, weight):
    """The size of what a row's arithmetic cancels, in units of y: max|w| * (1 + |mean| * rstd)."""
    wmax = 1.0 if weight is None else weight.double().abs().max().clamp(min=1e-30)
    cond = 1.0 + (mean.abs() * rstd) if op == "layer_norm" else torch.ones_like(rstd)
    return (wmax * torch.nan_to_num(cond, nan=1.0, posinf=1.0)).unsqueeze(-1)


def stat_floor(name, op, mean, rstd, stat_dtype):
    """The absolute part of mean's or rstd's allowance, one per row."""
    if name == "mean":  # a float32 sum's error: relative to the row's spread and offset
        return STAT_FLOOR[stat_dtype] * (mean.abs() + 1.0 / rstd).nan_to_num(nan=0.0)
    cond = row_scale(op, mean, rstd, None).squeeze(-1)  # a stable variance errs by about u * cond
    return STAT_FLOOR[stat_dtype] * (rstd.abs() * cond).nan_to_num(nan=0.0)


def compare_outputs(op, y, mean, rstd, ref, x_dtype, stat_dtype, weight, y_extra=None):
    """y within Y_ULPS ulps + Y_FLOOR * row_scale (+ the rounding contract's extra); mean and
    rstd within STAT_ULPS ulps of the statistics' dtype + their floor."""
    ref_y, ref_mean, ref_rstd = ref
    floor = Y_FLOOR[x_dtype] * row_scale(op, ref_mean, ref_rstd, weight)
    if y_extra is not None:
        floor = floor + y_extra
    found = [compare("y", y, ref_y, x_dtype, floor, Y_ULPS[x_dtype])]
    for name, got, want in (("mean", mean, ref_mean), ("rstd", rstd, ref_rstd)):
        if got is not None and want is not None:
            found.append(compare(name, got, want, stat_dtype, stat_floor(name, op, ref_mean, ref_rstd, stat_dtype),
                                 STAT_ULPS[stat_dtype]))
    return found
'''

ROUNDING = '''
def rounding_extra(op, x, ref, weight, bias, x_dtype):
    """The kernel declares "before_affine": x^ rounded to x's dtype before the weight, x^ * w
    again before the bias; each rounding costs half an ulp of that intermediate."""
    _, mean, rstd = ref
    x64, rstd = x.double(), rstd.unsqueeze(-1)
    xhat = (x64 - mean.unsqueeze(-1)) * rstd if op == "layer_norm" else x64 * rstd
    w = weight.double()
    extra = 0.5 * ulp(xhat, x_dtype) * w.abs()
    if bias is not None:
        extra = extra + 0.5 * ulp(xhat * w, x_dtype)
    return torch.nan_to_num(extra, nan=0.0, posinf=0.0)
'''

BACKWARD = '''
def reference_backward(op, x, dy, weight=None, bias=None, eps=None):
    """dx, dw and db in float64 from the analytic formulas (x^ the normalised row, g = dy * w):
    dx = rstd * (g - mean(g) - x^ * mean(g * x^)) (no mean(g) for RMSNorm); dw = sum of dy * x^;
    db = sum of dy."""
    xhat, _, rstd = reference(op, x, None, None, eps)
    rstd = rstd.unsqueeze(-1)
    dy64 = dy.double()
    g = dy64 * weight.double() if weight is not None else dy64
    proj = (g * xhat).mean(dim=-1, keepdim=True)
    if op == "layer_norm":
        dx = rstd * (g - g.mean(dim=-1, keepdim=True) - xhat * proj)
    else:
        dx = rstd * (g - xhat * proj)
    lead = tuple(range(x.dim() - 1))
    dw = (dy64 * xhat).sum(dim=lead) if weight is not None else None
    db = dy64.sum(dim=lead) if bias is not None else None
    return {"dx": dx, "dw": dw, "db": db}


def backward_floors(op, x, dy, weight, eps, stat_dtype):
    """The part of dx's, dw's and db's allowance beyond their ulps (docs/checks.md, *Backward
    tolerance*): per row x^, rstd and cond = 1 + |mean| * rstd of the float64 forward."""
    _, mean, rstd = reference(op, x, None, None, eps)
    n = x.shape[-1]
    x2, dy2 = x.reshape(-1, n).double(), dy.reshape(-1, n).double()
    rstd = rstd.reshape(-1, 1).double()
    mean = mean.reshape(-1, 1).double() if op == "layer_norm" else torch.zeros_like(rstd)
    rows = x2.shape[0]
    xhat = torch.nan_to_num((x2 - mean) * rstd, nan=0.0, posinf=0.0, neginf=0.0)
    cond = torch.nan_to_num(1.0 + mean.abs() * rstd, nan=1.0, posinf=1.0) if op == "layer_norm" \\
        else torch.ones_like(rstd)
    rstd = torch.nan_to_num(rstd, nan=0.0, posinf=0.0)
    dy2 = torch.nan_to_num(dy2, nan=0.0, posinf=0.0, neginf=0.0)
    g = dy2 * weight.double() if weight is not None else dy2
    u_s = UNIT_ROUNDOFF.get(stat_dtype, U32)
    rms_g = g.pow(2).mean(dim=-1, keepdim=True).sqrt()
    scale = rstd * (g.abs() + rms_g * (1.0 + xhat.abs()))
    floors = {"dx": (DX_ULPS, (DX_K * (U32 + u_s * cond) * scale).reshape(x.shape))}
    t = dy2 * xhat
    term = (U32 + u_s * cond) * dy2.abs() * (1.0 + xhat.abs())
    floors["dw"] = (PARAM_ULPS, ACC_LAMBDA * U32 * math.sqrt(max(rows, 1)) * t.pow(2).sum(dim=0).sqrt()
                    + DX_K * term.pow(2).sum(dim=0).sqrt())
    floors["db"] = (PARAM_ULPS, ACC_LAMBDA * U32 * math.sqrt(max(rows, 1)) * dy2.pow(2).sum(dim=0).sqrt())
    return floors


def in_range(ref, dtype):
    """Beyond the dtype's largest value (by half an ulp) the correctly rounded result is infinite."""
    limit = torch.finfo(dtype).max * (1 + 2.0 ** -(MANTISSA_BITS[dtype] + 1))
    return torch.where(ref.abs() >= limit, ref.sign() * math.inf, ref)


def compare_grads(grads, ref, floors, x_dtype):
    """dx, and dw and db where the reference has them; one not written is NaN everywhere."""
    found = []
    for name in ("dx", "dw", "db"):
        if ref[name] is None:
            continue
        want, got = in_range(ref[name], x_dtype), grads.get(name)
        if got is None:
            got = torch.full_like(want, math.nan)
        ulps, floor = floors[name]
        found.append(compare(name, got, want, x_dtype, floor, ulps))
    return found
'''

FP8 = '''
def fp8_neighbours(v, fmt):
    """(lo, hi, nearest): the two fp8 values around float64 ``v`` saturated to the format's range,
    and the one rounding to nearest even gives."""
    top = torch.finfo(fmt).max
    c = v.clamp(-top, top)
    nearest = c.float().to(fmt)
    r = nearest.double()
    bits = nearest.view(torch.uint8).to(torch.int16)
    negative, magnitude = bits >= 0x80, bits & 0x7F
    up = torch.where(~negative, bits + 1, torch.where(magnitude == 0, 1, bits - 1))
    down = torch.where(negative, bits + 1, torch.where(magnitude == 0, 0x81, bits - 1))
    from_bits = lambda b: (b & 0xFF).to(torch.uint8).view(fmt).double()  # noqa: E731
    return torch.where(r <= c, r, from_bits(down)), torch.where(r >= c, r, from_bits(up)), r


def fp8_compare(got, y64, scale, fmt, nan_rule, y_floor):
    """An fp8 y: the nearest fp8 value of y / scale (saturated), or either neighbour within
    FP8_MIDPOINT_DELTA of a gap (+ the float32 floor) of their midpoint; NaN as declared."""
    v, o = y64.double() / scale, got.double()
    lo, hi, nearest = fp8_neighbours(v, fmt)
    top = torch.finfo(fmt).max
    c = v.clamp(-top, top)
    gap = hi - lo
    near_mid = (c - (lo + hi) / 2).abs() <= FP8_MIDPOINT_DELTA * gap + y_floor / scale
    ok = (o == nearest) | (near_mid & ((o == lo) | (o == hi)))
    want_nan = {"nan": torch.isnan(o), "max": o == top, "-max": o == -top}[nan_rule]
    ref_nan = torch.isnan(v)
    ok = torch.where(ref_nan, want_nan, ok & torch.isfinite(o))
    step = torch.where(gap > 0, gap, torch.ones_like(gap))
    err = torch.where(ref_nan | ~torch.isfinite(o), torch.where(ok, 0.0, math.inf), (o - c).abs() / step)
    ratio = torch.where(ok, torch.zeros_like(err), 1.0 + err)
    finite = torch.isfinite(c) & torch.isfinite(o)
    flat = int(torch.argmax(ratio.reshape(-1)))
    diff = torch.where(finite, o - c, torch.zeros_like(o))
    ref_l2 = float(torch.where(finite, c, torch.zeros_like(c)).norm())
    max_ulp = float(torch.where(finite, err, torch.zeros_like(err)).max())
    return summary("y", int((~ok).sum()), o.numel(), float(diff.abs().max()), max_ulp,
                   float(diff.norm()) / ref_l2 if ref_l2 else 0.0, float(ratio.reshape(-1)[flat]), o.shape, flat,
                   o.reshape(-1)[flat], v.reshape(-1)[flat], True)
'''


def constants(x_dtype: torch.dtype, stat_dtype: torch.dtype, backward: bool, fp8: bool) -> list[str]:
    """The allowance's constants as the harness holds them, for the case's dtypes."""
    dt = lambda d: str(d)  # noqa: E731  ("torch.bfloat16")
    keys = dict.fromkeys([x_dtype, stat_dtype, torch.float32])
    table = lambda name, src: f"{name} = {{{', '.join(f'{dt(d)}: {src[d]!r}' for d in keys)}}}"  # noqa: E731
    lines = ["# The allowance's constants, as harness/judging/compare.py holds them for this case's dtypes.",
             table("Y_ULPS", compare.Y_ULPS), table("Y_FLOOR", compare.Y_FLOOR),
             table("STAT_ULPS", compare.STAT_ULPS), table("STAT_FLOOR", compare.STAT_FLOOR)]
    if backward:
        cb = compare_backward
        lines += ["# compare_backward.py's: float32's unit roundoff, the statistics' unit roundoff, dx's and",
                  "# the sums' units (docs/checks.md, *Backward tolerance*).",
                  f"U32 = {cb.U32!r}",
                  f"UNIT_ROUNDOFF = {{{', '.join(f'{dt(d)}: {u!r}' for d, u in cb.UNIT_ROUNDOFF.items())}}}",
                  f"DX_ULPS, DX_K, PARAM_ULPS, ACC_LAMBDA = {cb.DX_ULPS!r}, {cb.DX_K!r}, {cb.PARAM_ULPS!r}, "
                  f"{cb.ACC_LAMBDA!r}"]
    if fp8:
        lines += [f"FP8_MIDPOINT_DELTA = {compare_fused.FP8_MIDPOINT_DELTA!r}  # of a gap, either neighbour passes",
                  f"RESIDUAL_ULPS = {compare_fused.RESIDUAL_ULPS!r}"]
    else:
        lines.append(f"RESIDUAL_ULPS = {compare_fused.RESIDUAL_ULPS!r}  # residual_out: within an ulp of the exact sum")
    return lines + [""]
