"""Every selected kernel that launches with programmatic dependent launch reads what the kernel
before it wrote (harness.judging.dependent_launch): a CUDA graph of a producer that writes x and
the residual, then the norm, at the decode shapes. Where PDL cannot run (the CPU, a card before
sm_90, NORMDIFF_PDL=0) each check is skipped with that reason."""
import pytest

from harness.judging.dependent_launch import SHAPES, check_dependent_launch
from harness.running.run import STATE


def pytest_generate_tests(metafunc):
    if "pdl_kernel_shape" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[STATE]
    params = [(k, m, n) for k in state.kernels + state.fused_kernels if getattr(k, "pdl", False) for m, n in SHAPES]
    metafunc.parametrize("pdl_kernel_shape", params,
                         ids=[f"{k.op}-{k.name}-{m}x{n}-bfloat16" for k, m, n in params])


@pytest.mark.needs("small")
def test_reads_what_the_kernel_before_wrote(pdl_kernel_shape):
    kernel, m, n = pdl_kernel_shape
    result = check_dependent_launch(kernel, m, n)
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.ok, f"{kernel.name} at {m} x {n}, launched with PDL after a producer:\n" + "\n".join(result.failures)
