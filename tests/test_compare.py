"""The tolerance policy: ulps, floors, NaN and infinity handling, and the stated criteria."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.judging import compare
from impls.reference import reference


@pytest.mark.parametrize(
    "dtype,value,expected",
    [
        (torch.bfloat16, 1.0, 2.0**-7),
        (torch.bfloat16, 1.99, 2.0**-7),
        (torch.bfloat16, -3.0, 2.0**-6),
        (torch.float16, 1.0, 2.0**-10),
        (torch.float16, 1e-7, 2.0**-24),  # subnormal spacing
        (torch.float32, 1.0, 2.0**-23),
        (torch.float32, 0.0, 2.0**-149),
    ],
)
def test_ulp_is_the_dtype_spacing(dtype, value, expected):
    assert compare.ulp(torch.tensor([value], dtype=torch.float64), dtype).item() == expected


def test_ulp_matches_nextafter_for_float32():
    v = torch.randn(1000, dtype=torch.float32) * 100
    step = (torch.nextafter(v.abs(), torch.tensor(math.inf)) - v.abs()).double()
    assert torch.equal(compare.ulp(v.double(), torch.float32), step)


def _y_check(out, ref, dtype):
    return compare.compare("y", out, ref, dtype, compare.Y_FLOOR[dtype], compare.Y_ULPS[dtype])


def test_one_bf16_ulp_passes_two_fail():
    ref = torch.full((8,), 1.5, dtype=torch.float64)
    one = (ref + 2.0**-7).to(torch.bfloat16)
    two = (ref + 2 * 2.0**-7).to(torch.bfloat16)
    assert _y_check(one, ref, torch.bfloat16).ok
    stats = _y_check(two, ref, torch.bfloat16)
    assert not stats.ok and stats.mismatched == 8 and stats.max_ulp == 2.0


def test_nan_must_match_nan_exactly():
    ref = torch.tensor([1.0, math.nan, 2.0], dtype=torch.float64)
    assert _y_check(torch.tensor([1.0, math.nan, 2.0]), ref, torch.float32).ok
    missing = _y_check(torch.tensor([1.0, 5.0, 2.0]), ref, torch.float32)
    extra = _y_check(torch.tensor([math.nan, math.nan, 2.0]), ref, torch.float32)
    assert missing.mismatched == 1 and extra.mismatched == 1 and extra.worst_index == (0,)


def test_infinity_must_match_exactly():
    ref = torch.tensor([math.inf, 1.0], dtype=torch.float64)
    assert _y_check(torch.tensor([math.inf, 1.0]), ref, torch.float32).ok
    assert not _y_check(torch.tensor([-math.inf, 1.0]), ref, torch.float32).ok
    assert not _y_check(torch.tensor([1.0, math.inf]), ref, torch.float32).ok


def test_statistics_are_reported_even_when_passing():
    ref = torch.linspace(-3, 3, 101, dtype=torch.float64)
    out = ref.float()
    stats = _y_check(out, ref, torch.float32)
    assert stats.ok and 0 < stats.max_abs < 1e-6 and 0 < stats.rel_l2 < 1e-7 and stats.numel == 101


@settings(max_examples=300, deadline=None)
@given(
    ref=st.floats(-1e3, 1e3, allow_nan=False),
    wmax=st.floats(0.5, 2.0),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
)
def test_at_least_as_strict_as_the_stated_criteria(ref, wmax, dtype):
    """For ordinary rows (mean near zero, weights about one) the allowed error of y is within
    atol=rtol=1e-4 for float32 and atol=rtol=1e-2 for float16/bfloat16."""
    crit = 1e-4 if dtype == torch.float32 else 1e-2
    r = torch.tensor([ref], dtype=torch.float64)
    allowed = compare.Y_ULPS[dtype] * compare.ulp(r, dtype) + compare.Y_FLOOR[dtype] * wmax
    assert allowed.item() <= crit + crit * abs(ref)


def test_row_scale_grows_with_the_mean_in_standard_deviations():
    x = (1e4 + torch.randn(2, 512, dtype=torch.float64)).float()
    ref = reference("layer_norm", x, eps=1e-5)
    scale = compare.row_scale("layer_norm", ref.mean, ref.rstd, None)
    assert (scale > 5e3).all() and (scale < 2e4).all()
    assert torch.equal(compare.row_scale("rms_norm", None, ref.rstd, None), torch.ones(2, 1, dtype=torch.float64))


def test_distance_is_in_units_of_the_allowance():
    a = torch.tensor([1.0, math.nan])
    allowance = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert compare.distance(a, torch.tensor([1.0, 2.0]), allowance) == math.inf  # NaN pattern differs
    assert compare.distance(a, a.clone(), allowance) == 0.0
    assert compare.distance(a, torch.tensor([2.0, math.nan]), allowance) == 2.0


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_rounding_before_affine_is_allowed_exactly_that(op):
    """A kernel that rounds x^ (and x^*w) to the input dtype before the affine step, as apex does, fails the
    round-once allowance on large weights and passes once it declares that contract; an error of
    a few such roundings more still fails."""
    gen = torch.Generator().manual_seed(0)
    dt = torch.float16
    x = torch.randn(256, 1000, generator=gen).to(dt)
    w = (1 + 0.5 * torch.randn(1000, generator=gen)).to(dt)
    b = (0.5 * torch.randn(1000, generator=gen)).to(dt) if op == "layer_norm" else None
    ref = reference(op, x, w, b, 1e-5)
    xhat = ((x.double() - ref.mean[:, None]) if op == "layer_norm" else x.double()) * ref.rstd[:, None]
    y = (xhat.to(dt).double() * w.double()).to(dt).double()
    if b is not None:
        y = y + b.double()
    y = y.to(dt)

    def ok(out, rounding):
        extra = compare.rounding_allowance(rounding, op, x, ref, w, b, dt)
        stats = compare.compare_outputs(op, type(ref)(y=out, mean=ref.mean.float() if op == "layer_norm" else None,
                                                      rstd=ref.rstd.float()), ref, dt, torch.float32, w, extra)
        return stats[0].ok

    assert not ok(y, "once")
    assert ok(y, "before_affine")
    off = (y.double() + 4 * compare.ulp(xhat * w.double(), dt)).to(dt)
    assert not ok(off, "before_affine")
    assert compare.rounding_allowance("before_affine", op, x, ref, None, None, dt) is None


def test_agreement_covers_the_statistics_in_allowed_errors():
    """Two kernels with the same y but an rstd 10 allowances apart disagree by 10, on rstd."""
    from harness.judging import compare as cmp
    from harness.judging.cases import Case
    from harness.judging.inputs import make_inputs
    from impls.base import NormOutputs
    from impls.reference import reference

    inp = make_inputs(Case("layer_norm", "bfloat16", (8, 1000)))
    ref = reference("layer_norm", inp.x, inp.weight, inp.bias, inp.eps)
    out = NormOutputs(y=ref.y.to(torch.bfloat16), mean=ref.mean.float(), rstd=ref.rstd.float())
    allowed = cmp.stat_allowance("rstd", "layer_norm", ref, torch.float32)
    off = NormOutputs(y=out.y, mean=out.mean, rstd=(ref.rstd + 10 * allowed).float())
    same = cmp.agreement("layer_norm", ref, torch.bfloat16, inp.weight, (out, None, torch.float32), (out, None, torch.float32))
    assert same == (0.0, "y")
    d, output = cmp.agreement("layer_norm", ref, torch.bfloat16, inp.weight, (out, None, torch.float32),
                              (off, None, torch.float32))
    assert output == "rstd" and 8 < d < 12


# -- the backward's allowances (harness.judging.compare_backward), both ways -----------------------------
def _bwd_case(op, dtype, shape, dist="normal", dy_dist="normal"):
    from harness.judging.cases import Case
    from harness.judging.runner import BackwardOracleCache

    case = Case(op, dtype, shape, dist=dist, dy_dist=dy_dist)
    inputs, dy, _, ref = BackwardOracleCache().get(case, "cpu")
    return inputs, dy, ref


def _stats32(op, x):
    """float32 two-pass statistics, as an honest kernel saves them."""
    xf = x.float()
    mean = xf.mean(-1) if op == "layer_norm" else torch.zeros(x.shape[0])
    var = ((xf - mean[:, None]) ** 2).mean(-1)
    return mean, torch.rsqrt(var + (1e-5 if op == "layer_norm" else 1e-6))


def _sum_rows(t, order):
    """A float32 sum over rows in a kernel's order: one running sum (atomics, a loop over rows),
    partial sums per block of 64 rows then a running sum of those, or torch's own tree."""
    if order == "sequential":
        acc = torch.zeros_like(t[0])
        for row in t:
            acc = acc + row
        return acc
    if order == "blocks":
        return _sum_rows(torch.stack([b.sum(0) for b in t.split(64)]), "sequential")
    return t.sum(0)


def _float32_backward(op, inputs, dy, order="blocks", stat_round=None, drop_rows=()):
    """An honest float32 backward (stats rounded to ``stat_round`` where given, as a kernel whose
    statistics have that precision saves them); ``drop_rows``: rows left out of dw and db (a defect)."""
    from impls.base import NormGrads

    x, w, b = inputs.x, inputs.weight, inputs.bias
    mean, rstd = _stats32(op, x)
    if stat_round is not None:
        mean, rstd = mean.to(stat_round).float(), rstd.to(stat_round).float()
    xhat = (x.float() - mean[:, None]) * rstd[:, None]
    g = dy.float() * w.float() if w is not None else dy.float()
    c1 = g.mean(-1, keepdim=True) if op == "layer_norm" else 0.0
    dx = rstd[:, None] * (g - c1 - xhat * (g * xhat).mean(-1, keepdim=True))
    keep = torch.ones(x.shape[0], dtype=torch.bool)
    keep[list(drop_rows)] = False
    dw = _sum_rows((dy.float() * xhat)[keep], order).to(x.dtype) if w is not None else None
    db = _sum_rows(dy.float()[keep], order).to(x.dtype) if b is not None else None
    return NormGrads(dx=dx.to(x.dtype), dw=dw, db=db)


def _failing(grads, ref, dtype, stat_dtype=torch.float32):
    from harness.judging.compare_backward import compare_grads

    return {e.output for e in compare_grads(grads, ref, DT[dtype], stat_dtype) if not e.ok}


DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HONEST = [("layer_norm", (17, 1000), "normal", "normal"), ("rms_norm", (17, 1000), "normal", "normal"),
          ("layer_norm", (17, 4097), "large_mean", "normal"), ("rms_norm", (1025, 769), "normal", "outliers"), ("rms_norm", (17, 4000), "offset", "normal"),
          ("layer_norm", (1025, 1000), "normal", "outliers"), ("layer_norm", (17, 1000), "normal", "zeros"),
          ("rms_norm", (4097, 127), "normal", "normal"), ("layer_norm", (1, 7), "normal", "normal")]


@pytest.mark.parametrize("op,shape,dist,dy_dist", HONEST, ids=["-".join(map(str, h)) for h in HONEST])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_honest_backward_results_pass(op, shape, dist, dy_dist, dtype):
    """The oracle rounded once to the dtype; float32 kernels summing dw and db over rows in one
    running sum, in blocks, or in a tree; and a kernel with 16-bit statistics that declares them."""
    inputs, dy, ref = _bwd_case(op, dtype, shape, dist, dy_dist)
    rounded = type(ref.grads)(**{k: v.to(DT[dtype]) for k, v in ref.grads.fields().items()})
    assert not _failing(rounded, ref, dtype)
    for order in ("sequential", "blocks", "tree"):
        assert not _failing(_float32_backward(op, inputs, dy, order), ref, dtype), order
    low = _float32_backward(op, inputs, dy, stat_round=torch.bfloat16)
    assert not _failing(low, ref, dtype, stat_dtype=torch.bfloat16)


def _catalogue_m_dtypes():
    """Every (M, dtype) of the full backward catalogue (its 2-D cases)."""
    from harness.judging.cases import backward_catalogue

    return sorted({(c.rows, c.dtype) for c in backward_catalogue("full") if len(c.shape) == 2 and c.n > 1})


@pytest.mark.parametrize("m,dtype", _catalogue_m_dtypes())
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_a_dropped_tail_block_or_outlier_row_fails_at_every_catalogue_m(op, m, dtype):
    """dw (and db) left without the last partial block of rows (blocks of 4, 64, 128: whichever
    leave one at this M), or without the row whose dy is 100 times larger, fail; the same sum
    of every row passes (N = 64 here: the claim is about M)."""
    inputs, dy, ref = _bwd_case(op, dtype, (m, 64), dy_dist="outliers" if m > 1 else "normal")
    assert not _failing(_float32_backward(op, inputs, dy, "sequential"), ref, dtype)
    tails = {range(m - m % block, m) for block in (4, 64, 128) if m % block}
    assert tails, f"M={m} is a multiple of every block"
    defects = [_float32_backward(op, inputs, dy, "blocks", drop_rows=tail) for tail in tails]
    if m > 1:
        defects.append(_float32_backward(op, inputs, dy, "blocks", drop_rows=[m // 2]))  # the outlier row
    for grads in defects:
        assert _failing(grads, ref, dtype) == ({"dw", "db"} if op == "layer_norm" else {"dw"})


@pytest.mark.parametrize("n", [1, 7, 127, 769, 1000, 4000, 4097, 12345])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dx_defects_fail(n, dtype):
    """LayerNorm's dx without its mean term fails in every dtype at every N; row dot products
    divided by a padded length (blocks of 128) fail in float32 wherever N is not a multiple."""
    inputs, dy, ref = _bwd_case("layer_norm", dtype, (17, n))
    honest = _float32_backward("layer_norm", inputs, dy)
    assert not _failing(honest, ref, dtype)
    mean, rstd = _stats32("layer_norm", inputs.x)
    xhat = (inputs.x.float() - mean[:, None]) * rstd[:, None]
    g = dy.float() * inputs.weight.float()
    no_mean = type(honest)(dx=(rstd[:, None] * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(DT[dtype]),
                           dw=honest.dw, db=honest.db)
    assert _failing(no_mean, ref, dtype) == {"dx"}
    padded = -(-n // 128) * 128
    if dtype == "float32" and padded != n:
        f = n / padded
        wrong = (rstd[:, None] * (g - f * g.mean(-1, keepdim=True) - xhat * f * (g * xhat).mean(-1, keepdim=True)))
        assert _failing(type(honest)(dx=wrong, dw=honest.dw, db=honest.db), ref, dtype) == {"dx"}


@pytest.mark.parametrize("op,dist,planted", [("layer_norm", "large_mean", "one_pass_variance"),
                                             ("rms_norm", "nan_row", None), ("layer_norm", "normal", "rstd_as_std")])
def test_chunked_oracle_judges_as_the_whole_one(monkeypatch, op, dist, planted):
    """Beyond ORACLE_WHOLE_ELEMENTS a case is judged in row chunks, each against its own oracle (a
    float64 copy of a 2**31-element case is 16 GiB): the same verdicts, counts, worst element and
    error sizes as one comparison over the whole, here with chunks of 3 rows over 17 (a tail)."""
    from harness.judging import runner
    from harness.judging.cases import Case
    from tests.planted import PLANTED, Correct

    kernel = PLANTED[planted](op) if planted else Correct(op)
    case = Case(op=op, dtype="bfloat16", shape=(17, 300), dist=dist)
    whole = runner.check(kernel, case)
    monkeypatch.setattr(runner, "ORACLE_WHOLE_ELEMENTS", 1000)
    monkeypatch.setattr(runner, "ORACLE_CHUNK_ELEMENTS", 3 * 300)
    oracle = runner.OracleCache()
    assert isinstance(oracle.get(case, "cpu")[1], runner.ChunkedReference)
    assert [len(range(17)[rows]) for rows, _ in oracle.get(case, "cpu")[1].chunks()] == [3] * 5 + [2]
    chunked = runner.check(kernel, case, oracle=oracle, keep_outputs=True)
    assert chunked.outputs is None  # no agreement matrix without a whole oracle
    assert [e.output for e in chunked.errors] == [e.output for e in whole.errors]
    for a, b in zip(chunked.errors, whole.errors):
        assert (a.mismatched, a.numel, a.worst_index, a.max_abs, a.max_ulp, a.worst_ratio) == \
               (b.mismatched, b.numel, b.worst_index, b.max_abs, b.max_ulp, b.worst_ratio)
        assert a.rel_l2 == pytest.approx(b.rel_l2, rel=1e-12)
        assert a.to_dict().keys() == b.to_dict().keys() and "err_l2" not in a.to_dict()
    assert chunked.ok == whole.ok == (planted is None)


def test_cases_beyond_2_31_elements_are_skipped_on_the_cpu():
    """Even with --profile full on the CPU the huge cases do not run there (nothing is drawn)."""
    from harness.judging import runner
    from harness.judging.cases import catalogue
    from tests.planted import Correct

    huge = next(c for c in catalogue("full") if c.rows * c.n > 2**31)
    result = runner.check(Correct(huge.op), huge)
    assert result.skipped and "GPU only" in result.skipped and not result.ok
