"""A kernel author's own fused add + RMSNorm in Triton, in place only, with Gemma's weight offset,
shaped like FlashInfer's call: ``fused_add_rmsnorm(input, residual, weight, eps, weight_offset)``
does ``residual += input; input = rmsnorm(residual) * (weight + weight_offset)``. It runs on a CPU
(Triton's interpreter) and on a GPU (compiled). docs/interface.md, *Adding a fused backend*, walks
through it.

    pytest harness --backend-file examples/triton_fused_backend.py --backend myfused --profile quick

``fused_add_rmsnorm`` is the library call, usable without the project (the imports below from
``impls`` serve the kernel class only); the class declares to the harness what the call does:
in place only, statistics on the float32 sum, residual_out in the residual's dtype (a float32
residual under 16-bit x taken too), offsets 0 and 1, strided rows, any N.
"""
import torch

# Before triton is used: without a GPU, the interpreter for this process whatever imported triton
# first. On a GPU it does nothing.
from impls.triton import use_interpreter

use_interpreter()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from impls.base import ReproCall, cuda_present  # noqa: E402
from impls.fused import FusedNormKernel, FusedOutputs, FusedParams  # noqa: E402
from impls.registry import register  # noqa: E402
from impls.repro_calls import source_of  # noqa: E402

MAX_BLOCK = 4096  # longer rows go in tiles of this many


@triton.jit
def _round_bf16(v):
    """v rounded to nearest even at bfloat16's precision, in float32: the interpreter's cast to
    bfloat16 truncates, the GPU's rounds; rounded first, the cast is exact either way. NaN kept."""
    bits = v.to(tl.uint32, bitcast=True)
    r = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(v != v, v, r)


@triton.jit
def _fused_add_rmsnorm_row(X, R, W, N, stride_x, stride_r, eps, w_offset,
                           HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                           ROUND_X: tl.constexpr, ROUND_R: tl.constexpr):
    """One program per row. Pass 1 only reads (the sum of squares of s = x + r in float32); pass 2
    reads each tile of x and r again and writes that tile: r = s, x = y. Each tile is read before
    it is written and never read again, and s is recomputed in float32, not read back from r,
    which may hold it rounded. TILES (cdiv(N, BLOCK_N)) is a constant: the interpreter cannot loop
    to a bound given at run time (with NumPy 2), and most rows are one tile."""
    row = tl.program_id(0).to(tl.int64)  # int64 offsets: M x stride may pass 2^31
    xrow = X + row * stride_x
    rrow = R + row * stride_r
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for t in range(0, TILES):
        cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = cols < N
        s = tl.load(xrow + cols, mask=mask, other=0.0).to(tl.float32) + \
            tl.load(rrow + cols, mask=mask, other=0.0).to(tl.float32)
        acc += s * s  # masked lanes are 0
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for t in range(0, TILES):
        cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = cols < N
        s = tl.load(xrow + cols, mask=mask, other=0.0).to(tl.float32) + \
            tl.load(rrow + cols, mask=mask, other=0.0).to(tl.float32)
        y = s * rstd
        if HAS_WEIGHT:
            y = y * (tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + w_offset)
        if ROUND_R:
            s = _round_bf16(s)
        if ROUND_X:
            y = _round_bf16(y)
        tl.store(rrow + cols, s.to(R.dtype.element_ty), mask=mask)
        tl.store(xrow + cols, y.to(X.dtype.element_ty), mask=mask)


# Decorated under the interpreter (no GPU) it is an InterpretedFunction and takes CPU tensors.
INTERPRETED = type(_fused_add_rmsnorm_row).__name__ == "InterpretedFunction"


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """t as 2-D rows of its own storage (written in place: never a copy)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name}'s last dimension must be contiguous")
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name}'s rows are not one stride apart: no view of them as rows") from None


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                      weight_offset: float = 0.0) -> None:
    """In place: ``residual += input`` (in residual's dtype), then ``input = residual * rstd *
    (weight + weight_offset)``, the statistics and y from the float32 sum. input: (..., N) float32,
    float16 or bfloat16; residual: input's shape, input's dtype or float32; weight: (N,) in
    input's dtype, or None; rows may be strided, the last dimension contiguous."""
    x2, r2 = _rows(input, "input"), _rows(residual, "residual")
    if r2.shape != x2.shape or residual.dtype not in (input.dtype, torch.float32):
        raise ValueError("residual must have input's shape and input's dtype or float32")
    m, n = x2.shape
    if m == 0 or n == 0:
        return
    block = min(triton.next_power_of_2(n), MAX_BLOCK)
    _fused_add_rmsnorm_row[(m,)](
        x2, r2, weight if weight is not None else x2, n, x2.stride(0), r2.stride(0), float(eps),
        float(weight_offset), HAS_WEIGHT=weight is not None, BLOCK_N=block, TILES=triton.cdiv(n, block),
        ROUND_X=INTERPRETED and input.dtype == torch.bfloat16,
        ROUND_R=INTERPRETED and residual.dtype == torch.bfloat16,
    )


@register
class MyFusedAddRMSNorm(FusedNormKernel):
    op, backend, variant = "add_rms_norm", "myfused", "inplace"
    outputs = ("y", "residual_out")  # no mean or rstd: the call returns none (and has no backward)
    writes = ("in_place",)  # residual += input, input = y: the call has no other form
    stats_on = "float32_sum"  # rstd and y from the float32 sum, not from residual_out rounded
    residual_dtypes = ("same", "float32")  # residual_out keeps the residual's dtype (the default)
    weight_offsets = (0.0, 1.0)  # 1.0: Gemma's (1 + w), added in float32 to the weight as stored
    devices = ("cpu",) if INTERPRETED else ("cuda",)
    packages = ("triton",)
    call_name = "fused_add_rmsnorm(x, residual, weight, eps, weight_offset)"
    source = "examples/triton_fused_backend.py: fused_add_rmsnorm, _fused_add_rmsnorm_row"

    def availability(self):
        if not INTERPRETED and not cuda_present():
            return "no CUDA device, and triton was imported compiled: set TRITON_INTERPRET=1 before importing triton"
        return None

    def note(self):
        return f"triton {triton.__version__}, " + ("under the interpreter" if INTERPRETED else "compiled")

    def _forward(self, x, residual, weight, bias, eps, params: FusedParams, out: FusedOutputs) -> None:
        # Under write="in_place" (the only one declared) out.y is x and out.residual_out is
        # residual: the call writes them where they are.
        fused_add_rmsnorm(x, residual, weight, eps, params.weight_offset)

    def repro_call(self):
        """A standalone repro (python -m harness.repro) holds the library call and its kernels, and
        calls it as above."""
        source = "\n\n\n".join((f"MAX_BLOCK = {MAX_BLOCK}", source_of(_round_bf16, _fused_add_rmsnorm_row),
                                  "INTERPRETED = type(_fused_add_rmsnorm_row).__name__ == 'InterpretedFunction'",
                                  source_of(_rows, fused_add_rmsnorm)))
        return ReproCall(imports="import triton\nimport triton.language as tl", source=source,
                         forward="fused_add_rmsnorm(x, residual, weight, eps, params.weight_offset)",
                         requires="pip install triton")
