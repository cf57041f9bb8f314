"""float8_e4m3fn's poison (0xFF) is a NaN a kernel may write: an element holding it is called
unwritten only when a second call, into buffers poisoned with 0x7F, leaves that poison there too.
A kernel writing -NaN is judged on its values; one that skips elements is still found; the second
call is made only where the first left poison-valued elements."""
from __future__ import annotations

import torch

from harness.judging import guards
from harness.judging.fused_cases import fused_case_from_id
from harness.judging.fused_runner import check_fused
from impls.torch_fused import TorchRMSNormFused, normalize, quantize_fp8

OVERFLOWS = "rms_norm-bfloat16-17x1000-normal-e4m3s0.00390625"  # y / scale passes 448 in both signs
NAN_ROW = "rms_norm-bfloat16-17x1000-nan_row-e4m3s1"


class Counted(TorchRMSNormFused):
    variant = "counted"

    def __init__(self):
        super().__init__()
        self.calls = 0

    def _forward(self, x, residual, weight, bias, eps, params, out):
        self.calls += 1
        self.write(x, weight, bias, eps, params, out)

    def write(self, x, weight, bias, eps, params, out):
        super()._forward(x, None, weight, bias, eps, params, out)


class NegativeOverflowIsNegativeNan(Counted):
    """A conversion without saturation: y / scale beyond -448 comes out as 0xFF (-NaN)."""
    variant = "negative_overflow_nan"

    def write(self, x, weight, bias, eps, params, out):
        super().write(x, weight, bias, eps, params, out)
        y, _, _ = normalize(self.op, x.float(), weight, bias, eps, params.weight_offset)
        top = torch.finfo(params.out_dtype).max
        guards.bits_of(out.y)[y / params.scale < -top] = -1  # 0xFF


class SkipsLastRow(Counted):
    """Never writes y's last row."""
    variant = "skips_last_row"

    def write(self, x, weight, bias, eps, params, out):
        y, _, rstd = normalize(self.op, x.float(), weight, bias, eps, params.weight_offset)
        out.y[:-1].copy_(quantize_fp8(y, params)[:-1])
        out.rstd.copy_(rstd.view(-1))


class NanRowAsNegativeNan(Counted):
    """Writes a NaN row's NaN as 0xFF, as a GPU conversion may: a correct output."""
    variant = "nan_row_negative_nan"

    def write(self, x, weight, bias, eps, params, out):
        super().write(x, weight, bias, eps, params, out)
        bits = guards.bits_of(out.y)
        bits[torch.isnan(out.y)] = -1


def test_the_honest_kernel_is_called_once():
    kernel = Counted()
    result = check_fused(kernel, fused_case_from_id(OVERFLOWS))
    assert result.ok, result.failure_message()
    assert kernel.calls == 1


def test_negative_nan_for_an_overflow_is_a_wrong_value_not_unwritten():
    kernel = NegativeOverflowIsNegativeNan()
    result = check_fused(kernel, fused_case_from_id(OVERFLOWS))
    assert kernel.calls == 2  # the first call left poison-valued elements
    assert not result.ok and result.findings == []
    (y,) = [e for e in result.errors if e.output == "y"]
    assert not y.ok and y.mismatched > 0
    assert "y" in result.failure_message() and "unwritten" not in result.failure_message()


def test_an_unwritten_row_is_still_unwritten():
    kernel = SkipsLastRow()
    case = fused_case_from_id(OVERFLOWS)
    result = check_fused(kernel, case)
    assert kernel.calls == 2
    (finding,) = result.findings
    assert (finding.output, finding.kind, finding.count, finding.first) == ("y", "unwritten", case.n, [case.rows - 1, 0])


def test_a_nan_row_written_as_negative_nan_passes():
    kernel = NanRowAsNegativeNan()
    result = check_fused(kernel, fused_case_from_id(NAN_ROW))
    assert kernel.calls == 2 and result.ok, result.failure_message()


def test_only_an_element_poisoned_in_both_calls_is_unwritten():
    x = torch.empty(2, 4)
    first = guards._guard("y", tuple(x.shape), torch.float8_e4m3fn, "cpu", guards.GAP)
    second = guards._guard("y", tuple(x.shape), torch.float8_e4m3fn, "cpu", guards.GAP, second=True)
    assert (first.poison, second.poison) == (-1, 0x7F)
    for g in (first, second):
        g.view.fill_(1.0)
    guards.bits_of(first.view)[0, 1] = guards.bits_of(second.view)[0, 1] = -1  # written -NaN both times
    guards.bits_of(first.view)[1, 2] = -1  # left alone: each call's poison
    guards.bits_of(second.view)[1, 2] = 0x7F
    assert [(f.kind, f.count) for f in guards.inspect([first])] == [("unwritten", 2)]
    (finding,) = guards.inspect([first], [second])
    assert (finding.kind, finding.count, finding.first) == ("unwritten", 1, [1, 2])
