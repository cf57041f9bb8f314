"""The project's Triton kernels of the fused family (impls.triton.fused, ``triton.fused``) against
the eager composition (impls.torch_fused) and the float64 oracle (impls.reference.reference_fused):
every op, every write convention (in place really writing into x and residual, adjacent views of
one buffer), a float32 residual, Gemma's offset, both fp8 formats with a saturating scale and a
NaN, padded rows, rows over several chunks (forced on small N through ONE_TILE_MAX), and the
backward against the composition's. Small shapes: Triton runs under its interpreter without a GPU.
"""
import pytest
import torch

import impls.triton as tri
from impls import registry
from impls.base import UnsupportedCase
from impls.fused import FusedOutputs, NormInputError, fp8_max
from impls.reference import reference_fused
from impls.triton import fused as tf

registry.load_builtins()
pytestmark = pytest.mark.skipif(tri.availability() is not None, reason=f"triton cannot run: {tri.availability()}")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16, F32 = torch.bfloat16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ADD = ("add_rms_norm", "add_layer_norm")
# y against the composition (same float32 math, another reduction order) and the float64 oracle.
TOL = {BF16: dict(rtol=1.6e-2, atol=1e-2), F32: dict(rtol=2e-5, atol=2e-5)}


def kernels(op):
    return registry.get(op, "triton", "fused"), registry.get(op, "torch", "fused")


def inputs(op, m, n, dtype=BF16, residual_dtype=None, mean=0.0, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * m + n)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    x = (rnd(m, n) + mean).to(dtype).to(DEVICE)
    r = rnd(m, n).to(residual_dtype or dtype).to(DEVICE) if op in ADD else None
    w = (1 + 0.3 * rnd(n)).to(dtype).to(DEVICE)
    b = (0.3 * rnd(n)).to(dtype).to(DEVICE) if "layer" in op else None
    return x, r, w, b


def clone(t):
    return None if t is None else t.clone()


def check_against(op, got: FusedOutputs, x, r, w, b, dtype, offset=0.0, composed: FusedOutputs | None = None,
                  tol: dict | None = None):
    """got against the oracle (y, mean, rstd within TOL, residual_out = the exact sum rounded
    once) and, where given, the composition's outputs."""
    tol = tol or TOL[dtype]
    ref, _ = reference_fused(op, x, r, w, b, weight_offset=offset)
    torch.testing.assert_close(got.y.double(), ref.y, **tol)
    torch.testing.assert_close(got.rstd.double(), ref.rstd, rtol=1e-5, atol=0)
    if ref.mean is not None:
        torch.testing.assert_close(got.mean.double(), ref.mean, rtol=1e-5, atol=1e-6)
    if ref.residual_out is not None:
        assert torch.equal(got.residual_out, ref.residual_out.float().to(got.residual_out.dtype))
    if composed is not None:
        for name, t in composed.fields().items():
            if name == "residual_out":
                assert torch.equal(getattr(got, name), t)
            else:
                torch.testing.assert_close(getattr(got, name).float(), t.float(), **tol)


# -- forward ------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm", "rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_each_op_against_the_composition_and_the_oracle(op, dtype):
    x, r, w, b = inputs(op, 5, 1000, dtype, mean=3.0 if "layer" in op else 0.0)  # 1000: 24 padded lanes
    mine, theirs = kernels(op)
    got = mine(x, r, w, b)
    check_against(op, got, x, r, w, b, dtype, composed=theirs(x, r, w, b))


@pytest.mark.parametrize("op", ADD)
@pytest.mark.parametrize("write", ["in_place", "out_y"])
@pytest.mark.parametrize("adjacent", [False, True])
def test_writes_land_where_the_convention_says(op, write, adjacent):
    """in_place: y in x's storage, residual_out in residual's; out_y: y in out.y (strided here),
    residual_out in residual's. Adjacent views of one buffer ([x | residual] rows) included."""
    m, n = 4, 96
    x0, r0, w, b = inputs(op, m, n)
    if adjacent:
        buf = torch.cat([x0, r0], dim=1)
        x, r = buf[:, :n], buf[:, n:]
    else:
        x, r = x0.clone(), r0.clone()
    mine, theirs = kernels(op)
    expect = theirs(x0, r0, w, b)
    out = None
    if write == "out_y":
        y_buf = torch.zeros(m, n + 32, dtype=x.dtype, device=DEVICE)  # row stride > N
        stat = lambda: torch.empty(m, dtype=F32, device=DEVICE)  # noqa: E731
        out = FusedOutputs(y=y_buf[:, :n], mean=stat() if op == "add_layer_norm" else None, rstd=stat())
    got = mine(x, r, w, b, write=write, out=out)
    assert got.residual_out.data_ptr() == r.data_ptr() and torch.equal(r, expect.residual_out)
    if write == "in_place":
        assert got.y.data_ptr() == x.data_ptr()
        torch.testing.assert_close(x.float(), expect.y.float(), **TOL[BF16])
    else:
        assert got.y.data_ptr() == out.y.data_ptr() and torch.equal(x, x0)  # x untouched
        torch.testing.assert_close(out.y.float(), expect.y.float(), **TOL[BF16])
        assert not y_buf[:, n:].any()  # nothing past N written
    check_against(op, got, x0, r0, w, b, BF16)


@pytest.mark.parametrize("op", ADD)
def test_float32_residual_with_bfloat16_x(op):
    """residual_out float32 (the residual's dtype), y bfloat16; in place into the float32 residual."""
    x, r, w, b = inputs(op, 3, 200, BF16, residual_dtype=F32)
    mine, theirs = kernels(op)
    expect = theirs(x, r, w, b)
    got = mine(x, r, w, b)
    assert got.residual_out.dtype == F32 and got.y.dtype == BF16
    check_against(op, got, x, r, w, b, BF16, composed=expect)
    x2, r2 = x.clone(), r.clone()
    mine(x2, r2, w, b, write="in_place")
    assert torch.equal(r2, expect.residual_out)
    torch.testing.assert_close(x2.float(), expect.y.float(), **TOL[BF16])


@pytest.mark.parametrize("op", ["add_rms_norm", "rms_norm"])
def test_gemma_offset_uses_one_plus_w_in_float32(op):
    """Small w: (1 + w) rounded to bfloat16 would lose w; the kernel adds the offset in float32."""
    x, r, _, _ = inputs(op, 3, 256)
    w = (torch.randn(256, generator=torch.Generator().manual_seed(5)) * 2**-9).to(BF16).to(DEVICE)
    mine, theirs = kernels(op)
    got = mine(x, r, w, weight_offset=1.0)
    check_against(op, got, x, r, w, None, BF16, offset=1.0, composed=theirs(x, r, w, weight_offset=1.0))


def fp8_step(v: torch.Tensor, fmt) -> torch.Tensor:
    """One fp8 step (ulp) of the format at |v|."""
    mbits, emin = tf.FP8_FORMAT[fmt]
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0**emin))).clamp_min(emin)
    return torch.exp2(e - mbits)


@pytest.mark.parametrize("op", ["add_rms_norm", "rms_norm", "layer_norm"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_fp8_output_saturates_and_keeps_nan(op, fmt):
    """y / scale clamped to the format's maximum before the cast: past it gives the maximum (never
    NaN or inf); a NaN in a row makes that row NaN and leaves the others alone."""
    m, n = 4, 300
    x, r, w, b = inputs(op, m, n, F32)
    x[1, 7] = float("nan")
    scale = 2.0**-9 if fmt == E4M3 else 2.0**-16  # |y| > 0.875 saturates: about 40% of y
    mine, theirs = kernels(op)
    got = mine(x, r, w, b, out_dtype=fmt, scale=scale)
    expect = theirs(x, r, w, b, out_dtype=fmt, scale=scale)
    assert got.y.dtype == fmt
    y, e = got.y.float(), expect.y.float()
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2, 3]]).any()
    assert not torch.isinf(y).any()
    top = fp8_max(fmt)
    ref, _ = reference_fused(op, x, r, w, b)
    want = (ref.y / scale).clamp(-top, top)
    ok = [0, 2, 3]
    saturated = want[ok].abs() >= top
    assert saturated.float().mean() > 0.25 and (y[ok].abs()[saturated] == top).all()
    # Within one fp8 step of the oracle and of the composition (the nearest value but where the
    # two float32 computations round either side of a midpoint).
    assert ((y[ok].double() - want[ok]).abs() <= fp8_step(want[ok], fmt)).all()
    assert ((y[ok] - e[ok]).abs() <= fp8_step(e[ok].double(), fmt).float()).all()
    assert (y[ok] == e[ok]).float().mean() > 0.97


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_fp8_rounds_to_nearest_even_including_subnormals(fmt):
    """Every finite value of the format, and the midpoints between neighbours (ties), as torch's
    cast rounds them: subnormals and signed zero (a tie next to -0) included. A row of ones has
    rstd 1 exactly (eps 0), so y = w + 0 and the cast alone decides (w = -0 is left out: -0 + 0 is
    +0)."""
    vals = torch.arange(256, dtype=torch.uint8).view(fmt).float()
    vals = vals[vals.isfinite()].sort().values
    mids = (vals[:-1] + vals[1:]) / 2
    v = torch.cat([vals, mids])
    v = v[(v != 0) | ~v.signbit()].to(DEVICE)
    mine, _ = kernels("rms_norm")
    got = mine(torch.ones(1, v.numel(), device=DEVICE), None, v, eps=0.0, out_dtype=fmt, scale=1.0)
    assert torch.equal(got.y.view(torch.uint8).reshape(-1), v.to(fmt).view(torch.uint8))


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm", "layer_norm"])
@pytest.mark.parametrize("n", [1000, 4097])
def test_rows_over_several_chunks(op, n, monkeypatch):
    """ONE_TILE_MAX 1024 runs N 4097 in five chunks (the last of one column) and N 1000 in one
    tile; with 256, N 1000 in four (the last padded). Large-mean LayerNorm rows must not cancel:
    only the float32 mean's own rounding (a few ulps of 1e4, times rstd) may enter y, where
    E[s^2] - E[s]^2 would lose the variance (an error of about 1e8 * 2**-24). In place too: every
    chunk read before it is overwritten."""
    for tile in (1024, 256):
        monkeypatch.setattr(tf, "ONE_TILE_MAX", tile)
        x, r, w, b = inputs(op, 3, n, F32, mean=1e4 if "layer" in op else 0.0)
        mine, theirs = kernels(op)
        expect = theirs(x, r, w, b)
        got = mine(x, r, w, b)
        check_against(op, got, x, r, w, b, F32, composed=expect, tol=dict(rtol=2e-5, atol=1e-2))
        if op in ADD:
            x2, r2 = x.clone(), r.clone()
            mine(x2, r2, w, b, write="in_place")
            assert torch.equal(r2, got.residual_out) and torch.equal(x2, got.y)


@pytest.mark.parametrize("op", ["add_layer_norm", "layer_norm"])
@pytest.mark.parametrize("tile", [8192, 256])
def test_layer_norm_of_a_constant_row_is_its_bias(op, tile, monkeypatch):
    """x^ = 0 on a row of one value, so y = b: a mean rounded on the way (a float32 sum of N equal
    values need not be exact on the GPU) would come back times rstd = 1/sqrt(eps), about 316."""
    monkeypatch.setattr(tf, "ONE_TILE_MAX", tile)
    m, n = 3, 1000
    x, r, w, b = inputs(op, m, n, F32)
    x = torch.tensor([3.3, -71.7, 0.1], device=DEVICE)[:, None].expand(m, n).contiguous()
    if r is not None:
        r = torch.full((m, n), 0.7, device=DEVICE)
    mine, _ = kernels(op)
    got = mine(x, r, w, b)
    torch.testing.assert_close(got.y, b.expand(m, n), rtol=0, atol=1e-6)
    fp8 = mine(x, None if r is None else r, w, b, out_dtype=E4M3, scale=0.25) if op == "layer_norm" else None
    if fp8 is not None:
        assert torch.equal(fp8.y.view(torch.uint8), (b / 0.25).expand(m, n).to(E4M3).view(torch.uint8))


def test_long_rows_at_the_default_setting():
    """N 65537: chunks of the default setting, the last of one column; bfloat16 residual_out."""
    op = "add_layer_norm"
    x, r, w, b = inputs(op, 2, 65537, BF16, mean=50.0)
    mine, theirs = kernels(op)
    assert mine.config(65537, BF16).block_n <= tf.ONE_TILE_MAX < 65537
    check_against(op, mine(x, r, w, b), x, r, w, b, BF16, composed=theirs(x, r, w, b))


def test_a_rows_bits_do_not_depend_on_the_batch():
    mine, _ = kernels("add_rms_norm")
    x, r, w, _ = inputs("add_rms_norm", 7, 300)
    all_rows = mine(x, r, w)
    one = mine(x[3:4], r[3:4], w)
    for name, t in one.fields().items():
        assert torch.equal(t, getattr(all_rows, name)[3:4]), name


def test_declarations_and_refusals():
    for op in ("add_rms_norm", "add_layer_norm", "rms_norm", "layer_norm"):
        k = registry.get(op, "triton", "fused")
        assert k.project and k.family == "fused" and k.packages == ("triton",) and k.stats_on == "float32_sum"
        assert k.residual_dtypes == ("same", "float32") and k.fp8_nan == "nan"
        assert k.writes == (("new", "in_place", "out_y") if op in ADD else ("new",))
        assert k.has_backward
    assert registry.get("add_layer_norm", "triton", "fused").out_dtypes == (None,)
    mine, _ = kernels("add_rms_norm")
    x, r, w, _ = inputs("add_rms_norm", 2, 64)
    with pytest.raises(UnsupportedCase, match="float16 residual"):
        mine(x, r.half(), w)
    with pytest.raises(NormInputError, match="in_place"):
        mine(x, r, w, out_dtype=E4M3, scale=1.0, write="in_place")
    assert registry.get("rms_norm", "triton", "fused") not in registry.kernels(["triton"], "rms_norm")  # plain ones


# -- backward -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op,offset,residual_dtype,with_dro", [
    ("add_rms_norm", 1.0, F32, True),
    ("add_rms_norm", 0.0, None, False),
    ("add_layer_norm", 0.0, None, True),
    ("add_layer_norm", 0.0, F32, False),
    ("rms_norm", 1.0, None, False),
    ("layer_norm", 0.0, None, False),
])
@pytest.mark.parametrize("n", [300, 9000])  # 9000: the backward's long-row form (column blocks)
def test_backward_against_the_composition(op, offset, residual_dtype, with_dro, n):
    m = 3
    x, r, w, b = inputs(op, m, n, BF16, residual_dtype=residual_dtype, mean=2.0 if "layer" in op else 0.0)
    mine, theirs = kernels(op)
    saved = mine(x, r, w, b, weight_offset=offset)
    g = torch.Generator().manual_seed(9)
    dy = torch.randn(m, n, generator=g).to(BF16).to(DEVICE)
    dro = torch.randn(m, n, generator=g).to(saved.residual_out.dtype).to(DEVICE) if with_dro else None
    got = mine.backward(x, r, w, b, dy, saved, d_residual_out=dro, weight_offset=offset)
    expect = theirs.backward(x, r, w, b, dy, saved, d_residual_out=dro, weight_offset=offset)
    assert got.dx.dtype == x.dtype and (r is None or got.dresidual.dtype == r.dtype)
    for name, t in expect.fields().items():
        mine_t = getattr(got, name)
        scale = t.float().abs().max().item()
        torch.testing.assert_close(mine_t.float(), t.float(), rtol=2e-2, atol=2e-2 * scale, msg=name)
    if r is not None:
        torch.testing.assert_close(got.dresidual.float(), got.dx.float(), rtol=1e-2, atol=0)


@pytest.mark.parametrize("op", ADD)
def test_backward_of_a_rounded_residual_out_uses_its_own_statistics(op):
    """A bfloat16 residual_out holds the float32 sum rounded, while the forward's saved mean and rstd
    are the float32 sum's: the gradient at residual_out needs its own (x^ of unit mean square).
    With the saved ones dx is off by their difference, about 2**-9 / sqrt(N) relative, which
    shows on dx's small elements: held here to one bfloat16 ulp of the float64 oracle and a floor
    far below that difference."""
    from impls.reference import reference_fused_backward

    m, n = 4, 300
    x, r, w, b = inputs(op, m, n, BF16, mean=1.0)
    mine, _ = kernels(op)
    saved = mine(x, r, w, b)
    g = torch.Generator().manual_seed(11)
    dy = torch.randn(m, n, generator=g).to(BF16).to(DEVICE)
    dro = torch.randn(m, n, generator=g).to(BF16).to(DEVICE)
    got = mine.backward(x, r, w, b, dy, saved, d_residual_out=dro)
    ref = reference_fused_backward(op, saved.residual_out, dy, dro, w, b)
    scale = ref.dx.abs().max().item()
    torch.testing.assert_close(got.dx.double(), ref.dx, rtol=2**-8, atol=1e-5 * scale)
    torch.testing.assert_close(got.dresidual.double(), ref.dx, rtol=2**-8, atol=1e-5 * scale)
