"""quack.default on rms_norm-bfloat16-3x7-normal: test_against_oracle of normdiff reproduced standalone.

The check: the forward against a float64 reference, inside a write guard, on cuda (the inputs are
drawn by torch's cuda generator: another device draws other values).
Written on this machine (no run's report given; --report names where it was seen): card no GPU
(CPU), driver -, CUDA -, torch 2.13.0+cpu, nvidia-cutlass-dsl not installed as a distribution,
quack-kernels not installed as a distribution, commit a92dde6 (with uncommitted changes), 2026-12-07
03:14:52 UTC.

Run: python quack-odd-n.py; exits 1 while the defect is present, 0 when the outputs are within the
allowance and the write guard, 2 where the kernel's library does not import. It needs torch and the
kernel's library (pip install quack-kernels==0.6.5 nvidia-cutlass-dsl==4.7.1).
Nothing of normdiff is imported.
Written by `python -m harness.repro`."""

import math
import os
import sys
from types import SimpleNamespace as Namespace

import torch  # noqa: E402

CASE, KERNEL = 'rms_norm-bfloat16-3x7-normal', 'quack.default'
DEVICE = 'cuda'
OP = 'rms_norm'
SEED = 1682015429  # from the case id (sha256), as the harness derives it
SHAPE = (3, 7)
LEAD, N = SHAPE[:-1], SHAPE[-1]
PAD = 0  # elements after each row of x (a row stride of N + PAD)
DIST = 'normal'
DTYPE = torch.bfloat16
EPS = 1e-06
STATS = ('rstd',)  # the statistics the kernel writes
STAT_DTYPE = torch.float32  # the precision it declares them in (their allowance)
ROUNDING = 'once'  # its declared rounding of y
HEAD, TAIL, GAP = 64, 64, 16  # canaries around each output, and after each row of y

# The allowance's constants, as harness/judging/compare.py holds them for this case's dtypes.
Y_ULPS = {torch.bfloat16: 1, torch.float32: 64}
Y_FLOOR = {torch.bfloat16: 0.001, torch.float32: 2e-06}
STAT_ULPS = {torch.bfloat16: 1, torch.float32: 64}
STAT_FLOOR = {torch.bfloat16: 0.001, torch.float32: 2e-06}
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
    return x, storage, weight, bias


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

# -- the call: quack.default through its library, as its plug-in calls it (NormKernel.repro_call)
try:
    import importlib

    quack_rmsnorm = importlib.import_module("quack.rmsnorm")  # the module
except ImportError as exc:  # not installed here: no verdict (exit 2)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    print("quack.default's library does not import here; this repro needs it: pip install quack-kernels==0.6.5 nvidia-cutlass-dsl==4.7.1", file=sys.stderr)
    sys.exit(2)

def vector(n: int, dtype: torch.dtype) -> int:
    """Elements of QuACK's widest access for rows of N: its row strides and starts are multiples."""
    return math.gcd(n, 16 // torch.empty((), dtype=dtype).element_size())


def as_quack_takes(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """``t`` where its rows (or its one row) start on QuACK's vector, else a fresh contiguous copy."""
    if t is None:
        return None
    v = vector(n, t.dtype)
    if t.stride(-1) == 1 and t.data_ptr() % (v * t.element_size()) == 0 and (t.dim() == 1 or t.stride(0) % v == 0):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _f32(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else as_quack_takes(t.float(), n)


def call_forward(x, weight, bias, eps, out):
    n = x.shape[-1]
    x, weight, bias = as_quack_takes(x, n), as_quack_takes(weight, n), as_quack_takes(bias, n)
    y, _, rstd = quack_rmsnorm.rmsnorm_fwd(x, weight, eps=eps, store_rstd=True)
    mean = None
    out.y.copy_(y.view(out.y.shape))
    out.rstd.copy_(rstd.reshape(-1))
    if out.mean is not None:
        out.mean.copy_(mean.reshape(-1))



def main():
    x, storage, weight, bias = draw_inputs()
    guards = [guard("y", SHAPE, DTYPE, GAP)] + [guard(s, LEAD, torch.float32, 0) for s in STATS]
    g = {k.name: k.view for k in guards}
    out = Namespace(y=rows_of(g["y"]), mean=flat(g.get("mean")), rstd=flat(g.get("rstd")))
    given = {"x": storage, "weight": weight, "bias": bias}
    before = {k: v.clone() for k, v in given.items() if v is not None}
    if not called(lambda: call_forward(rows_of(x), weight, bias, EPS, out)):
        return 1
    findings = inspect(guards) + inputs_modified(before, given)
    ref = reference(OP, x, weight, bias, EPS)
    extra = None
    if ROUNDING == "before_affine" and weight is not None and DTYPE != torch.float32:
        extra = rounding_extra(OP, x, ref, weight, bias, DTYPE)
    return verdict(findings, compare_outputs(OP, g["y"], g.get("mean"), g.get("rstd"), ref, DTYPE, STAT_DTYPE,
                                             weight, extra))


if __name__ == "__main__":
    sys.exit(main())
