"""The fp8 rule of the fused checks (harness.judging.compare_fused), both ways: a correctly
rounded output passes, a wrong neighbour fails, either neighbour passes at a midpoint (Triton's
interpreter rounds ties away from zero), saturation and NaN follow the declaration."""
import torch

from harness.judging.compare_fused import FP8_MIDPOINT_DELTA, fp8_neighbours, fp8_stats, residual_out_stats

E4M3 = torch.float8_e4m3fn


def judged(values, outputs, scale=1.0, nan_rule="nan", fmt=E4M3):
    y = torch.tensor(values, dtype=torch.float64) * scale
    return fp8_stats(torch.tensor(outputs, dtype=torch.float32).to(fmt), y, scale, fmt, nan_rule)


def test_neighbours():
    lo, hi, nearest = fp8_neighbours(torch.tensor([1.03, -1.03, 448.0, 0.0, 1000.0], dtype=torch.float64), E4M3)
    assert lo.tolist() == [1.0, -1.125, 448.0, 0.0, 448.0]
    assert hi.tolist() == [1.125, -1.0, 448.0, 0.0, 448.0]
    assert nearest.tolist() == [1.0, -1.0, 448.0, 0.0, 448.0]


def test_rounding_to_nearest_passes_and_the_far_neighbour_fails():
    assert judged([1.03, 1.1, -3.3], [1.0, 1.125, -3.25]).ok
    assert not judged([1.03], [1.125]).ok  # 0.24 of a gap from lo: not near the midpoint
    assert not judged([1.03], [1.25]).ok  # not a neighbour at all


def test_either_neighbour_at_a_midpoint():
    mid = 1.0625  # between 1.0 and 1.125: ties to even gives 1.0, ties away 1.125
    assert judged([mid], [1.0]).ok and judged([mid], [1.125]).ok
    off = mid + 2 * FP8_MIDPOINT_DELTA * 0.125  # beyond the band: only the nearest
    assert judged([off], [1.125]).ok and not judged([off], [1.0]).ok


def test_saturation_and_nan():
    assert judged([500.0, -1000.0], [448.0, -448.0]).ok
    assert judged([float("nan")], [float("nan")]).ok
    assert not judged([float("nan")], [448.0]).ok
    assert judged([float("nan")], [448.0], nan_rule="max").ok
    assert not judged([3.0], [float("nan")]).ok
    e5m2 = torch.float8_e5m2
    assert not judged([70000.0], [float("inf")], fmt=e5m2).ok and judged([70000.0], [57344.0], fmt=e5m2).ok


def test_a_double_rounding_through_bfloat16_fails_near_a_midpoint():
    # v just above the midpoint 1.0625 by 2**-9 relative: bfloat16 rounds it down to 1.0625 exactly,
    # then ties to even gives 1.0 where the nearest is 1.125.
    v = 1.0625 * (1 + 2.0**-9)
    via_bf16 = torch.tensor([v]).to(torch.bfloat16).float().to(E4M3).float().item()
    assert via_bf16 == 1.0
    assert not judged([v], [via_bf16]).ok and judged([v], [1.125]).ok


def test_the_float32_floor_widens_the_band_where_terms_cancel():
    v = 1.0625 + 0.01  # a tenth of a gap above the midpoint
    y = torch.tensor([v], dtype=torch.float64)
    out = torch.tensor([1.0]).to(E4M3)
    assert not fp8_stats(out, y, 1.0, E4M3, "nan").ok
    assert fp8_stats(out, y, 1.0, E4M3, "nan", y_floor=0.02).ok


def test_residual_out_is_faithful():
    exact = torch.tensor([1.0 + 2.0**-9], dtype=torch.float64)  # a bfloat16 tie
    for rounded in (1.0, 1.0 + 2.0**-7):
        assert residual_out_stats(torch.tensor([rounded]).to(torch.bfloat16), exact, torch.bfloat16).ok
    assert not residual_out_stats(torch.tensor([1.0], dtype=torch.float32), exact + 2.0**-12, torch.float32).ok
