"""A Triton RMSNorm plug-in that runs on a CPU (Triton's interpreter) and on a GPU (compiled):
one program per row, the row in one tile. docs/backends.md, *A Triton plug-in*, walks through it.

    pytest harness --backend-file examples/triton_rms_backend.py --backend mytriton --profile quick
    pytest --benchmark-only --backend-file examples/triton_rms_backend.py --backend mytriton

Without a GPU every check runs under the interpreter, and every benchmark row is skipped with
"triton runs under its interpreter on this machine: not a timing", as the built-in Triton
kernels' are: the interpreter's time is Python's, not the kernel's.
"""
import torch

# Before triton is used: without a GPU, the interpreter for this process whatever imported triton
# first (in the harness the built-in backends have chosen it already; a script that imports this
# file needs it). On a GPU it does nothing.
from impls.triton import use_interpreter

use_interpreter()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import inspect  # noqa: E402

from impls.base import NormKernel, ReproCall, cuda_present  # noqa: E402
from impls.registry import register  # noqa: E402


@triton.jit
def _rms_norm_row(X, W, Y, RSTD, N, stride_x, stride_y, eps,
                  HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_BF16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64 offsets: M x N may pass 2^31 elements
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)  # padded lanes are zero; divide by N
    y = x * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if ROUND_BF16:
        # The interpreter casts float32 to bfloat16 by truncation, the GPU rounds to nearest
        # even: round by hand first, so the cast is exact and the numerics are the GPU's.
        bits = y.to(tl.uint32, bitcast=True)
        y = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


# Decorated under the interpreter (no GPU) it is an InterpretedFunction and takes CPU tensors.
INTERPRETED = type(_rms_norm_row).__name__ == "InterpretedFunction"


@register
class MyTritonRMSNorm(NormKernel):
    op, backend, variant = "rms_norm", "mytriton", "rowwise"
    outputs = ("y", "rstd")
    devices = ("cpu",) if INTERPRETED else ("cuda",)
    max_n = 65536  # the row in one tile: longer rows are skipped with this limit as the reason
    packages = ("triton",)  # the reports state its version

    def availability(self):
        if not INTERPRETED and not cuda_present():
            return "no CUDA device, and triton was imported compiled: set TRITON_INTERPRET=1 before importing triton"
        return None

    def note(self):
        return f"triton {triton.__version__}, " + ("under the interpreter" if INTERPRETED else "compiled")

    def _forward(self, x, weight, bias, eps, out):
        # x: (M, N) rows, last dimension contiguous, row stride x.stride(0) >= N; out.y like x,
        # out.rstd (M,) float32; weight (N,) or None.
        m, n = x.shape
        if m == 0:
            return
        _rms_norm_row[(m,)](
            x, weight if weight is not None else x, out.y, out.rstd, n, x.stride(0), out.y.stride(0), eps,
            HAS_WEIGHT=weight is not None, BLOCK_N=triton.next_power_of_2(n),
            ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
        )

    def repro_call(self):
        """A standalone repro (python -m harness.repro) holds this file's kernel and calls it as above."""
        source = inspect.getsource(getattr(_rms_norm_row, "fn", _rms_norm_row))
        return ReproCall(imports="import triton\nimport triton.language as tl",
                         source=source + "\n\nINTERPRETED = type(_rms_norm_row).__name__ == 'InterpretedFunction'",
                         forward=REPRO_FORWARD)


REPRO_FORWARD = """
m, n = x.shape
_rms_norm_row[(m,)](
    x, weight if weight is not None else x, out.y, out.rstd, n, x.stride(0), out.y.stride(0), eps,
    HAS_WEIGHT=weight is not None, BLOCK_N=triton.next_power_of_2(n),
    ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
)
"""
