"""flashinfer.layernorm_quant on layer_norm-bfloat16-17x1000-normal-e4m3s1: test_fused_against_oracle of normdiff reproduced standalone.

The check: the fused forward with the case's write convention against a float64 reference, inside a
write guard, on cuda (the inputs are drawn by torch's cuda generator: another device draws other
values).
Written on this machine (no run's report given; --report names where it was seen): card no GPU
(CPU), driver -, CUDA -, torch 2.13.0+cpu, flashinfer-python not installed as a distribution,
nvidia-cutlass-dsl not installed as a distribution, commit a92dde6 (with uncommitted changes),
2026-12-07 03:15:07 UTC.

Run: python flashinfer-layernorm-quant.py; exits 1 while the defect is present, 0 when the outputs
are within the allowance and the write guard, 2 where the kernel's library does not import. It needs
torch and the kernel's library (pip install flashinfer-python==0.7.2.post1
nvidia-cutlass-dsl==4.7.1).
Nothing of normdiff is imported.
Written by `python -m harness.repro`."""

import math
import os
import sys
from types import SimpleNamespace as Namespace

import torch  # noqa: E402

CASE, KERNEL = 'layer_norm-bfloat16-17x1000-normal-e4m3s1', 'flashinfer.layernorm_quant'
DEVICE = 'cuda'
OP = 'layer_norm'
SEED = 2379673850  # from the case id (sha256), as the harness derives it
SHAPE = (17, 1000)
LEAD, N = SHAPE[:-1], SHAPE[-1]
PAD = 0  # elements after each row of x (a row stride of N + PAD)
DIST = 'normal'
DTYPE = torch.bfloat16
EPS = 1e-05
STATS = ()  # the statistics the kernel writes
STAT_DTYPE = torch.float32  # the precision it declares them in (their allowance)
ROUNDING = 'once'  # its declared rounding of y
HEAD, TAIL, GAP = 64, 64, 16  # canaries around each output, and after each row of y
BASE_OP = 'layer_norm'
WRITE = 'new'  # new / in_place / out_y
RESIDUAL_DTYPE = None
RESIDUAL_OUT_DTYPE = None
KEEP_DTYPE = torch.float32  # statistics on (float32_sum)
WEIGHT_OFFSET = 0.0
OUT_DTYPE = torch.float8_e4m3fn
SCALE = 1.0  # y / SCALE
KERNEL_SCALE = 1.0  # in the kernel's convention (divide)
FP8_NAN = '-max'

# The allowance's constants, as harness/judging/compare.py holds them for this case's dtypes.
Y_ULPS = {torch.bfloat16: 1, torch.float32: 64}
Y_FLOOR = {torch.bfloat16: 0.001, torch.float32: 2e-06}
STAT_ULPS = {torch.bfloat16: 1, torch.float32: 64}
STAT_FLOOR = {torch.bfloat16: 0.001, torch.float32: 2e-06}
FP8_MIDPOINT_DELTA = 0.0009765625  # of a gap, either neighbour passes
RESIDUAL_ULPS = 1.0


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

HEAD, TAIL = 64, 64  # poisoned canary elements before and after each input buffer

def poisoned(size, dtype):
    buffer = torch.empty(size, dtype=dtype, device=DEVICE)
    bits_of(buffer).fill_(POISON[dtype])
    return buffer

def place(buffer, col0, row_stride, values):
    """A view of SHAPE in ``buffer`` at HEAD + col0 with rows ``row_stride`` apart, holding ``values``."""
    stride, acc = [], 1
    for i, s in enumerate(reversed(SHAPE)):
        stride.append(acc)
        acc *= row_stride if i == 0 else s
    view = buffer.as_strided(SHAPE, tuple(reversed(stride)), HEAD + col0)
    view.copy_(values)
    return view

def draw_inputs():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    x_vals = make_x('normal', (*LEAD, N), DTYPE, gen)
    residual_vals = None
    rows = math.prod(LEAD)
    buffers, views = {}, {}
    buffers['x'] = poisoned(HEAD + rows * (N + PAD) + TAIL, DTYPE)
    views['x'] = ('x', place(buffers['x'], 0, N + PAD, x_vals))
    weight = bias = None
    weight = (1.0 + 0.5 * torch.randn(N, generator=gen, device=gen.device)).to(DTYPE)
    bias = (0.5 * torch.randn(N, generator=gen, device=gen.device)).to(DTYPE)
    return buffers, views, weight, bias


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


def buffer_findings(buffers, before, views, allowed):
    """Writes to x's and residual's buffers the write convention does not name: a view it does
    not write ("input modified"), or the canaries and padding around them ("out-of-bounds write")."""
    found = []
    for name, buffer in buffers.items():
        changed = bits_of(buffer) != bits_of(before[name])
        if not bool(changed.any()):
            continue
        outside = changed.clone()
        for view_name, (owner, view) in views.items():
            if owner != name:
                continue
            inside = torch.zeros_like(changed)
            inside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
            hit = changed & inside
            outside &= ~inside
            if view_name not in allowed and bool(hit.any()):
                first = int(torch.nonzero(hit.as_strided(view.shape, view.stride(), view.storage_offset()))[0][0])
                found.append(f"{view_name}: {int(hit.sum())} input modified element(s), first at element [{first}]")
        if bool(outside.any()):
            found.append(f"{name}: {int(outside.sum())} out-of-bounds write element(s), first at buffer offset "
                         f"[{int(torch.nonzero(outside)[0][0]) - HEAD}]")
    return found


def reference_fused(x, residual, weight, bias, eps):
    """residual_out = x + residual exactly; the row normalised is that sum rounded as the kernel
    declares (KEEP_DTYPE); the weight is WEIGHT_OFFSET + w in float64."""
    s = x.double()
    src = s
    if residual is not None:
        s = s + residual.double()
        src = s.to(KEEP_DTYPE).double()
    w = None if weight is None else weight.double() + WEIGHT_OFFSET
    return reference(BASE_OP, src, w, bias, eps), s, w

# -- the call: flashinfer.layernorm_quant through its library, as its plug-in calls it (NormKernel.repro_call)
try:
    import functools
    import importlib

    flashinfer_norm = importlib.import_module("flashinfer.norm")
except ImportError as exc:  # not installed here: no verdict (exit 2)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    print("flashinfer.layernorm_quant's library does not import here; this repro needs it: pip install flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.7.1", file=sys.stderr)
    sys.exit(2)

class UnsupportedCase(RuntimeError):
    """A layout the call does not take as it is (normdiff skips such a case)."""


def vector(n: int, dtype: torch.dtype) -> int:
    """Elements of FlashInfer's widest access for rows of N (16 bytes at most)."""
    return math.gcd(n, 16 // torch.empty((), dtype=dtype).element_size())


def as_flashinfer_takes(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """``t`` where FlashInfer's compiled kernels take it as it is (see the module docstring), else
    a fresh contiguous copy."""
    if t is None:
        return None
    size = t.element_size()
    if t.stride(-1) == 1:
        if t.is_contiguous() and t.data_ptr() % math.gcd(128, n * size) == 0 and t.data_ptr() % 16 == 0:
            return t
        if t.dim() == 2 and t.stride(0) % vector(n, t.dtype) == 0 and t.data_ptr() % 16 == 0:
            return t
    return t.clone(memory_format=torch.contiguous_format)


def _f32(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else as_flashinfer_takes(t.float(), n)


def _misfit(named: list, n: int, dtype: torch.dtype) -> tuple[int, str] | None:
    """(index, why) of the first tensor FlashInfer's compiled kernels would not take as it is, else
    None. Where every tensor of the call is contiguous (and M * N < 2**31) they run a compact
    kernel that assumes starts aligned to gcd(128, N * element bytes); else a strided one that
    assumes 16-byte starts and row strides a multiple of x's vector (fa.py:917-934, :979-1003,
    :1051-1055; rms.py:1276-1292). The compiled function checks the alignment at each call and
    raises ValueError (nvidia-cutlass-dsl 4.7.1, base_dsl/tvm_ffi_builder/tvm_ffi_builder.py:2197-2216)."""
    rows = named[0][1].shape[0]
    compact = all(t.is_contiguous() for _, t in named) and rows * n <= 2**31 - 1
    v = vector(n, dtype)
    for i, (label, t) in enumerate(named):
        if compact:
            align = math.gcd(128, n * t.element_size())
            if t.data_ptr() % align:
                return i, (f"{label} starts {t.data_ptr() % align} bytes past a {align}-byte boundary: flashinfer's "
                           f"compact kernel assumes {align}-byte aligned rows")
        elif t.data_ptr() % 16 or (t.shape[0] > 1 and t.stride(0) % v):
            return i, (f"{label}'s rows (start {t.data_ptr() % 16} bytes past 16, stride {t.stride(0)}) are not what "
                       f"flashinfer's strided kernel assumes: 16-byte aligned starts, strides a multiple of {v}")
    return None


def _take_rows(n: int, dtype: torch.dtype, read: dict, in_place: dict, y: torch.Tensor | None = None):
    """(the inputs FlashInfer only reads, the buffer it is to write y into) as its kernels take
    them: read inputs copied to fresh contiguous rows, and y given a fresh buffer (its caller then
    copies it into ``y``), where they would not be taken as they are. What it writes in place (x,
    residual) must fit as it is, else UnsupportedCase: a copy would not be the call."""
    target = y
    for _ in range(3):
        named = list(read.items()) + list(in_place.items()) + ([("out.y", target)] if target is not None else [])
        bad = _misfit(named, n, dtype)
        if bad is None:
            return read, target
        index, why = bad
        if len(read) <= index < len(read) + len(in_place):
            raise UnsupportedCase(why)
        if index < len(read):
            read = {k: t.clone(memory_format=torch.contiguous_format) for k, t in read.items()}
        else:
            target = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    raise UnsupportedCase(why)


def _into(y: torch.Tensor, written: torch.Tensor) -> None:
    if written is not y:
        y.copy_(written)


@functools.cache
def _scale_tensor(scale: float, device: str) -> torch.Tensor:
    """The fp8 scale as FlashInfer takes it: float32, shape (1,), on x's device (api.py:140-170)."""
    return torch.tensor([scale], dtype=torch.float32, device=device)


def _weight16(weight: torch.Tensor) -> torch.Tensor:
    return weight if weight.data_ptr() % 16 == 0 else weight.clone()  # compiled 16-byte aligned (fa.py:936)


def call_forward(x, residual, weight, bias, eps, params, out):
    n = x.shape[-1]
    dense = lambda t: t if t.stride(0) == n else t.clone(memory_format=torch.contiguous_format)  # noqa: E731
    y = out.y if out.y.stride(0) == n else torch.empty(out.y.shape, dtype=out.y.dtype, device=out.y.device)
    flashinfer_norm.layernorm_quant(y, dense(x), _f32(weight, n), _f32(bias, n),
                                    _scale_tensor(float(params.scale), str(x.device)), eps)
    _into(out.y, y)



def main():
    buffers, views, weight, bias = draw_inputs()
    x, residual = views["x"][1], views["residual"][1] if "residual" in views else None
    guards = [guard("y", SHAPE, OUT_DTYPE or DTYPE, GAP)] if WRITE != "in_place" else []
    if residual is not None and WRITE == "new":
        guards.append(guard("residual_out", SHAPE, RESIDUAL_OUT_DTYPE, GAP))
    guards += [guard(s, LEAD, torch.float32, 0) for s in STATS]
    g = {k.name: k.view for k in guards}
    y = x if WRITE == "in_place" else g["y"]
    residual_out = residual if WRITE != "new" else g.get("residual_out")
    out = Namespace(y=rows_of(y), residual_out=None if residual_out is None else rows_of(residual_out),
                    mean=flat(g.get("mean")), rstd=flat(g.get("rstd")))
    params = Namespace(weight_offset=WEIGHT_OFFSET, out_dtype=OUT_DTYPE, scale=KERNEL_SCALE, write=WRITE)
    before = {k: b.clone() for k, b in buffers.items()}
    given = {"weight": weight, "bias": bias}
    params_before = {k: v.clone() for k, v in given.items() if v is not None}
    r_rows = None if residual is None else rows_of(residual)
    (ref_y, mean, rstd), exact_sum, w_eff = reference_fused(x, residual, weight, bias, EPS)  # before x is written
    if not called(lambda: call_forward(rows_of(x), r_rows, weight, bias, EPS, params, out)):
        return 1
    if OUT_DTYPE is not None and WRITE != "in_place":  # an fp8 NaN may come out as the poison's bits
        bits = bits_of(g["y"])
        bits[(bits == POISON[OUT_DTYPE]) & torch.isnan(ref_y)] = 0x7F
    allowed = {"new": (), "in_place": ("x", "residual"), "out_y": ("residual",)}[WRITE]
    findings = inspect(guards) + buffer_findings(buffers, before, views, allowed) + inputs_modified(params_before, given)
    found = compare_outputs(BASE_OP, ref_y if OUT_DTYPE is not None else y, g.get("mean"), g.get("rstd"),
                            (ref_y, mean, rstd), DTYPE, STAT_DTYPE, w_eff)
    if OUT_DTYPE is not None:
        floor = Y_FLOOR[torch.float32] * row_scale(BASE_OP, mean, rstd, w_eff)
        found[0] = fp8_compare(y, ref_y, SCALE, OUT_DTYPE, FP8_NAN, floor)
    if residual is not None:
        found.append(compare("residual_out", residual_out, exact_sum, residual_out.dtype, 0.0, RESIDUAL_ULPS))
    return verdict(findings, found)


if __name__ == "__main__":
    sys.exit(main())
