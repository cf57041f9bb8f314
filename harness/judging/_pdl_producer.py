"""The dependent-launch check's producer (harness.judging.dependent_launch): a Triton kernel
that lets the kernel after it start at once, spins, then writes x and the residual. Imported on a
GPU only."""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

BLOCK = 1024


@triton.jit
def _produce(SRC_X, DST_X, SRC_R, DST_R, SINK, numel, spin, HAS_R: tl.constexpr, BLOCK: tl.constexpr):
    gdc_launch_dependents()  # the next kernel may start now: only its own wait holds it back
    acc = tl.program_id(0).to(tl.float32) + 1.0
    for _ in range(spin):  # a dependent chain the compiler cannot fold
        acc = acc * 0.9999 + 1.0
    tl.store(SINK + tl.program_id(0), acc)
    for start in range(0, numel, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < numel
        tl.store(DST_X + offs, tl.load(SRC_X + offs, mask=mask), mask=mask)
        if HAS_R:
            tl.store(DST_R + offs, tl.load(SRC_R + offs, mask=mask), mask=mask)


def write(src_x, dst_x, src_r, dst_r, spin: int) -> None:
    """dst_x = src_x (and dst_r = src_r), by one program, after ``spin`` steps of its spin."""
    import torch

    sink = torch.empty(1, dtype=torch.float32, device=dst_x.device)
    has_r = dst_r is not None
    _produce[(1,)](src_x, dst_x, src_r if has_r else src_x, dst_r if has_r else dst_x, sink, dst_x.numel(), spin,
                   HAS_R=has_r, BLOCK=BLOCK, num_warps=4)
