"""apex.fused on layer_norm-float32-1x483-normal-eps0.001-dynormal: test_fuzz_backward of normdiff reproduced standalone.

The check: the kernel's forward, then its backward against float64 gradients, inside a write guard,
on cuda (the inputs are drawn by torch's cuda generator: another device draws other values).
Written on this machine (no run's report given; --report names where it was seen): card no GPU
(CPU), driver -, CUDA -, torch 2.13.0+cpu, apex not installed as a distribution, commit a92dde6
(with uncommitted changes), 2026-12-07 03:14:40 UTC.

Run: python apex-one-row-layer.py; exits 1 while the defect is present, 0 when the outputs are
within the allowance and the write guard, 2 where the kernel's library does not import. It needs
torch and the kernel's library (apex with its CUDA extensions, built from a clone of NVIDIA/apex:
APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation .).
Nothing of normdiff is imported.
Written by `python -m harness.repro`."""

import math
import os
import sys
from types import SimpleNamespace as Namespace

import torch  # noqa: E402

CASE, KERNEL = 'layer_norm-float32-1x483-normal-eps0.001-dynormal', 'apex.fused'
DEVICE = 'cuda'
OP = 'layer_norm'
SEED = 2042642481  # from the case id (sha256), as the harness derives it
DY_SEED = 2488645883
SHAPE = (1, 483)
LEAD, N = SHAPE[:-1], SHAPE[-1]
PAD = 0  # elements after each row of x (a row stride of N + PAD)
DIST = 'normal'
DTYPE = torch.float32
EPS = 0.001
STATS = ('mean', 'rstd')  # the statistics the kernel writes
STAT_DTYPE = torch.float32  # the precision it declares them in (their allowance)
ROUNDING = 'before_affine'  # its declared rounding of y
HEAD, TAIL, GAP = 64, 64, 16  # canaries around each output, and after each row of y

# The allowance's constants, as harness/judging/compare.py holds them for this case's dtypes.
Y_ULPS = {torch.float32: 64}
Y_FLOOR = {torch.float32: 2e-06}
STAT_ULPS = {torch.float32: 64}
STAT_FLOOR = {torch.float32: 2e-06}
# compare_backward.py's: float32's unit roundoff, the statistics' unit roundoff, dx's and
# the sums' units (docs/checks.md, *Backward tolerance*).
U32 = 5.960464477539063e-08
UNIT_ROUNDOFF = {torch.float32: 5.960464477539063e-08, torch.float16: 0.00048828125, torch.bfloat16: 0.00390625, torch.float64: 1.1102230246251565e-16}
DX_ULPS, DX_K, PARAM_ULPS, ACC_LAMBDA = 1.0, 32.0, 1.0, 8.0
RESIDUAL_ULPS = 1.0  # residual_out: within an ulp of the exact sum


# -- the inputs, drawn as the harness draws them

# Signalling NaNs with a payload no arithmetic produces (fp8: a negative NaN a cast never gives).
POISON = {torch.float16: 32165, torch.bfloat16: 32677, torch.float32: 2141562277, torch.float8_e4m3fn: -1, torch.float8_e5m2: -3}
INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32}

def bits_of(t):
    return t.view(INT_VIEW[t.element_size()])

def make_x(dist, shape, dtype, gen):
    """x of one distribution, as harness/judging/inputs.py make_x draws it."""
    dev = gen.device
    normal = lambda: torch.randn(shape, generator=gen, dtype=torch.float64, device=dev)  # noqa: E731
    if dist == 'normal':
        x = normal()
    else:
        raise ValueError(dist)
    return x.to(dtype)

def draw_inputs():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    storage = make_x(DIST, (*LEAD, N + PAD), DTYPE, gen)  # x with PAD elements after each row
    x = storage[..., :N]
    weight = bias = None
    weight = (1.0 + 0.5 * torch.randn(N, generator=gen, device=gen.device)).to(DTYPE)
    bias = (0.5 * torch.randn(N, generator=gen, device=gen.device)).to(DTYPE)
    return x, storage, weight, bias

def draw_dy():
    gen = torch.Generator(device=DEVICE).manual_seed(DY_SEED)
    dy = torch.randn((*LEAD, N + PAD), generator=gen, dtype=torch.float64, device=DEVICE)
    flat = dy.view(-1, N + PAD)
    storage = dy.to(DTYPE)
    return storage[..., :N], storage


# -- the float64 reference, the allowance and the comparison (harness/judging/compare*.py)

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
    if all(strides[i] == strides[i + 1] * sizes[i + 1] or sizes[i] == 1 for i in range(len(sizes) - 1)) \
            and strides[-1] >= n:
        return t.as_strided((m, n), (strides[-1], 1))
    return t.reshape(m, n).contiguous()


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
    cond = torch.nan_to_num(1.0 + mean.abs() * rstd, nan=1.0, posinf=1.0) if op == "layer_norm" \
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


# -- the write guard: poisoned outputs with canaries (harness/judging/guards.py)

def guard(name, shape, dtype, gap):
    """A poisoned output inside a buffer: HEAD canaries before, TAIL after, ``gap`` after each row."""
    n = shape[-1] if shape else 1
    rows = math.prod(shape[:-1])
    buffer = torch.empty(HEAD + rows * (n + gap) + TAIL, dtype=dtype, device=DEVICE)
    bits_of(buffer).fill_(POISON[dtype])
    strides, acc = [], 1
    for i, s in enumerate(reversed(shape)):
        strides.append(acc)
        acc *= (n + gap) if i == 0 else s
    return Namespace(name=name, buffer=buffer, view=buffer.as_strided(shape, tuple(reversed(strides)), HEAD),
                     rows=rows, n=n, gap=gap)


def inspect(guards):
    """Unwritten elements (still the poison) and writes out of bounds (a canary changed)."""
    found = []
    for g in guards:
        poison = POISON[g.buffer.dtype]
        bits = bits_of(g.buffer)
        rows = bits.as_strided((g.rows, g.n), (g.n + g.gap, 1), HEAD)
        unwritten = torch.nonzero(rows == poison)
        if unwritten.shape[0]:
            offset, index = int(unwritten[0][0]) * (g.n + g.gap) + int(unwritten[0][1]), []
            for stride in g.view.stride():
                index.append(offset // stride)
                offset %= stride
            found.append(f"{g.name}: {unwritten.shape[0]} unwritten element(s), first at element {index}")
        canary = torch.ones_like(bits, dtype=torch.bool)
        canary.as_strided((g.rows, g.n), (g.n + g.gap, 1), HEAD).fill_(False)
        clobbered = torch.nonzero(canary & (bits != poison))
        if clobbered.shape[0]:
            found.append(f"{g.name}: {clobbered.shape[0]} out-of-bounds write element(s), first at buffer offset "
                         f"[{int(clobbered[0][0]) - HEAD}]")
    return found


def inputs_modified(before, given):
    """Inputs the call may not write that changed, bit for bit."""
    found = []
    for name, old in before.items():
        changed = torch.nonzero(bits_of(given[name]) != bits_of(old))
        if changed.shape[0]:
            found.append(f"{name}: {changed.shape[0]} input modified element(s), first at element "
                         f"{[int(i) for i in changed[0]]}")
    return found


def called(fn):
    """Run the call; an exception (a refused compile included) is the finding."""
    try:
        fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return True
    except Exception as exc:  # noqa: BLE001 (what the library raises is what this file shows)
        print(f"the call raised {type(exc).__name__}: {str(exc).strip()}")
        return False


def verdict(findings, found):
    for line in findings:
        print(f"guard: {line}")
    for line, _ in found:
        print(line)
    bad = bool(findings) or any(failed for _, failed in found)
    print("DEFECT PRESENT: outside the allowance or the write guard (exit 1)" if bad else
          "within the allowance and the write guard (exit 0)")
    return 1 if bad else 0


def flat(t):
    return None if t is None else t.view(-1)

# -- the call: apex.fused through its library, as its plug-in calls it (NormKernel.repro_call)
try:
    import fused_layer_norm_cuda  # apex's CUDA extension
except ImportError as exc:  # not installed here: no verdict (exit 2)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    print("apex.fused's library does not import here; this repro needs it: apex with its CUDA extensions, built from a clone of NVIDIA/apex: APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation .", file=sys.stderr)
    sys.exit(2)

def _backward_call(fn, *args):
    """Call the backward entry point ``fn`` with memory_efficient=False, or without the flag on
    builds from before it (their signature is the same less that last argument)."""
    try:
        return fn(*args, False)
    except TypeError as exc:
        if "incompatible function arguments" not in str(exc):
            raise
        return fn(*args)


def call_forward(x, weight, bias, eps, out):
    x = x.contiguous()
    if weight is None:
        y, mean, invvar = fused_layer_norm_cuda.forward(x, [x.shape[-1]], eps)
    else:
        y, mean, invvar = fused_layer_norm_cuda.forward_affine(x, [x.shape[-1]], weight, bias, eps)
    out.y.copy_(y)
    out.mean.copy_(mean.reshape(-1))
    out.rstd.copy_(invvar.reshape(-1))

def call_backward(x, weight, bias, dy, saved, eps, out):
    x, dy, n = x.contiguous(), dy.contiguous(), [x.shape[-1]]
    mean, rstd = saved.mean.contiguous(), saved.rstd.contiguous()
    if weight is None:
        out.dx.copy_(_backward_call(fused_layer_norm_cuda.backward, dy, mean, rstd, x, n, eps))
    else:
        dx, dw, db = _backward_call(fused_layer_norm_cuda.backward_affine, dy, mean, rstd, x, n, weight, bias, eps)
        out.dx.copy_(dx)
        out.dw.copy_(dw)
        out.db.copy_(db)



def main():
    x, storage, weight, bias = draw_inputs()
    dy, dy_storage = draw_dy()
    stat = lambda: torch.empty(LEAD, dtype=torch.float32, device=DEVICE)  # noqa: E731
    fwd = Namespace(y=torch.empty(SHAPE, dtype=DTYPE, device=DEVICE), mean=stat() if "mean" in STATS else None,
                    rstd=stat() if "rstd" in STATS else None)
    fwd_out = Namespace(y=rows_of(fwd.y), mean=flat(fwd.mean), rstd=flat(fwd.rstd))
    if not called(lambda: call_forward(rows_of(x), weight, bias, EPS, fwd_out)):  # its own mean and rstd
        return 1
    guards = [guard("dx", SHAPE, DTYPE, GAP)] + [guard(k, (N,), t.dtype, 0) for k, t in (("dw", weight), ("db", bias))
                                                if t is not None]
    g = {k.name: k.view for k in guards}
    grads = Namespace(dx=rows_of(g["dx"]), dw=g.get("dw"), db=g.get("db"))
    saved = Namespace(y=rows_of(x), mean=flat(fwd.mean), rstd=flat(fwd.rstd))
    given = {"x": storage, "weight": weight, "bias": bias, "dy": dy_storage, "mean": fwd.mean, "rstd": fwd.rstd}
    before = {k: v.clone() for k, v in given.items() if v is not None}
    if not called(lambda: call_backward(rows_of(x), weight, bias, rows_of(dy), saved, EPS, grads)):
        return 1
    findings = inspect(guards) + inputs_modified(before, given)
    ref = reference_backward(OP, x, dy, weight, bias, EPS)
    floors = backward_floors(OP, x, dy, weight, EPS, STAT_DTYPE)
    return verdict(findings, compare_grads(g, ref, floors, DTYPE))


if __name__ == "__main__":
    sys.exit(main())
