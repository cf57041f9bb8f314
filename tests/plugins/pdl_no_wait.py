"""A planted bug: an RMSNorm that launches with programmatic dependent launch but never waits
(griddepcontrol.launch_dependents without griddepcontrol.wait). Behind a producer it reads x
before the producer wrote it; alone it is exact, so only the dependent-launch check
(harness/test_dependent_launch.py) and its CPU twin (tools.pdl_wait_check) can see it.
Loaded with --backend-file; backend "nowait"."""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from impls.registry import register
from impls.triton.rms_norm import TritonRMSNormRowwise


@triton.jit
def _rms_norm_row_no_wait(
    X, W, Y, RSTD, M, N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, W_FIRST: tl.constexpr, ROUND_BF16: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:
        gdc_launch_dependents()  # the bug: no gdc_wait() before the loads
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(RSTD + row, rstd)
    y = x * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=cmask)


class _Kernels:
    """Where the kernel's launch finds its programs by name: the planted one at decode sizes."""

    def __getattr__(self, name):
        from impls.triton import _launch
        if name == "rms_norm_row":
            return _rms_norm_row_no_wait
        return getattr(_launch.state().kernels, name)


@register
class NoWaitRMSNorm(TritonRMSNormRowwise):
    backend = "nowait"
    project = False
    kernel_module = _Kernels()
