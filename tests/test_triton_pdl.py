"""The Triton kernels' launch with programmatic dependent launch (impls.pdl): at the decode
setting only, where PDL runs and the switch is on; and the fused kernels' decode rule and fp8
reciprocal. PDL cannot run on the CPU, so where it runs is stood in for (impls.pdl.unavailable
answering None, as on an sm_90 card); the launches are recorded, never run."""
import pytest
import torch

pytest.importorskip("triton")

from impls import pdl  # noqa: E402
from impls.fused import FusedParams  # noqa: E402
from impls.triton.fused import TritonAddRMSNorm, TritonRMSNormFused  # noqa: E402
from impls.triton.rms_norm import TritonRMSNormRowwise  # noqa: E402
from impls.triton.settings import DECODE_MAX_ROWS  # noqa: E402


@pytest.fixture
def as_on_sm90(monkeypatch):
    monkeypatch.setattr(pdl, "unavailable", lambda device: None)


def _plain_kwargs(m: int) -> dict:
    k = TritonRMSNormRowwise()
    x = torch.empty(m, 4096, dtype=torch.bfloat16)
    (launch,) = k.launches(x, torch.empty(4096, dtype=torch.bfloat16), None, cfg=k.config(4096, x.dtype, m))
    return launch.kwargs


def _fused_launch(kernel, m: int, out_dtype=None, scale=None) -> tuple:
    x = torch.empty(m, 4096, dtype=torch.bfloat16)
    r = torch.empty_like(x) if kernel.op.startswith("add_") else None
    (fn, _, args, kwargs), = kernel.launches(x, r, torch.empty(4096, dtype=x.dtype), None,
                                             FusedParams(0.0, out_dtype, scale))
    return fn, args, kwargs


def test_plain_decode_launches_with_pdl_where_it_runs(as_on_sm90):
    assert _plain_kwargs(1)["PDL"] and _plain_kwargs(1)["launch_pdl"]
    assert _plain_kwargs(DECODE_MAX_ROWS)["launch_pdl"]
    many = _plain_kwargs(16384)
    assert "PDL" not in many and "launch_pdl" not in many  # many rows: no latency to hide
    with pdl.forced(False):
        assert "launch_pdl" not in _plain_kwargs(1)


def test_the_row_limit_is_the_kernels_own_answer(as_on_sm90):
    """launches_pdl(device, rows): what the benchmark's rows record and the native replay trusts."""
    for kernel in (TritonRMSNormRowwise(), TritonAddRMSNorm()):
        assert kernel.launches_pdl("cuda", 1) and kernel.launches_pdl("cuda", DECODE_MAX_ROWS)
        assert not kernel.launches_pdl("cuda", DECODE_MAX_ROWS + 1)
        assert kernel.launches_pdl("cuda")  # any row count: whether it may at all


def test_no_pdl_where_it_cannot_run():
    assert pdl.unavailable("cpu") and "launch_pdl" not in _plain_kwargs(1)


def test_fused_decode_rule_and_pdl(as_on_sm90):
    k = TritonAddRMSNorm()
    assert k.config(4096, torch.bfloat16, 1).w_first and k.config(4096, torch.bfloat16, 64).rows == 1
    assert not k.config(4096, torch.bfloat16, 16384).w_first
    assert k.m_thresholds(type("S", (), {"n": 4096})()) == (DECODE_MAX_ROWS,)
    _, _, kw = _fused_launch(k, 1)
    assert kw["W_FIRST"] and kw["PDL"] and kw["launch_pdl"]
    _, _, kw = _fused_launch(k, 16384)
    assert not kw["W_FIRST"] and "launch_pdl" not in kw


def test_fused_fp8_multiplies_by_the_float32_reciprocal_taken_once():
    k = TritonRMSNormFused()
    _, args, kw = _fused_launch(k, 8, torch.float8_e4m3fn, 3.0)
    assert kw["FP8"] and kw["FP8_RECIP"]
    want = float(torch.tensor(1.0) / torch.tensor(3.0, dtype=torch.float32))
    assert args[-2] == want  # the scale argument: 1 / 3 in float32, not 3
