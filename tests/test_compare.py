"""The tolerance policy: ulps, floors, NaN and infinity handling, and the stated criteria."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import compare
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
    from harness import compare as cmp
    from harness.cases import Case, make_inputs
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
