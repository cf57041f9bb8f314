"""What every TileLang program builds with (_programs, _bwd_programs, _long_programs,
_fused_programs and the probe's candidates): the float32 name, the row fragment's layout, the
affine step and the sizes of the weight and bias parameters. Imports tilelang."""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang.plan import Plan

F32 = "float32"


def _row_layout(plan: Plan, rows: int, cols: int):
    """Fragment layout of a (rows, cols) tile: row r to thread group r, and within a row
    ``vec`` consecutive columns to one thread, consecutive vectors to consecutive threads
    (coalesced 16-byte accesses)."""
    tpr, vec = plan.threads_per_row, plan.vec
    return T.Fragment(
        (rows, cols),
        forward_thread_fn=lambda r, j: r * tpr + (j // vec) % tpr,
        forward_index_fn=lambda r, j: (j // (tpr * vec)) * vec + j % vec,
    )


def _affine(v, W, B, j, has_w: bool, has_b: bool):
    """float32 ``v * W[j] + B[j]``, with only the terms the kernel has (``j`` an index, or a tuple
    of them for 2-D buffers). Plain Python, run while TileLang parses a program: it returns the
    expression each kernel stores, with no branch in it."""
    j = j if isinstance(j, tuple) else (j,)
    if has_w:
        v = v * T.cast(W[j], F32)
    if has_b:
        v = v + T.cast(B[j], F32)
    return v


def _signature_sizes(plan: Plan):
    return (plan.n if plan.has_weight else 1), (plan.n if plan.has_bias else 1)
