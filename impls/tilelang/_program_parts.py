"""What every TileLang program builds with (_programs, _bwd_programs, _long_programs,
_fused_programs and the probe's candidates): the float32 name, the row fragment's layout, the
affine step, a PDL program's weight and bias, and the sizes of the weight and bias parameters.
Imports tilelang."""

# No "from __future__ import annotations": TileLang evaluates the parameter annotations.
import tilelang.language as T

from impls.tilelang.plan import Plan

F32 = "float32"


def _row_layout(plan: Plan, rows: int, cols: int, group: int | None = None):
    """Fragment layout of a (rows, cols) tile: row r to thread group r, and within a row
    ``group`` (default ``vec``) consecutive columns to one thread, consecutive groups to
    consecutive threads (coalesced 16-byte accesses; a group of two vectors lets an fp8 y store
    16 bytes a thread)."""
    tpr, vec = plan.threads_per_row, group or plan.vec
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


def _params_at(plan: Plan, W, B, wr, br, r, j):
    """(weight, bias, index) the affine step of row r, column j reads: with PDL the fragments the
    program loaded before its first store, at (r, j); else the global buffers, at j. TileLang
    drops ``__restrict__`` from a program that waits (griddepcontrol.wait), and a weight load may
    then not pass the stores before it: loaded in the store loop, each would wait for them."""
    return (wr, br, (r, j)) if plan.pdl else (W, B, j)


@T.macro
def _load_params(plan, wr, br, W, B, rows, cols):
    """A PDL program's weight and bias (where it has them: ``wr``, ``br`` not None), loaded into
    fragments of the row's layout right after the row (see _params_at); padded lanes zero."""
    if wr is not None:
        for r, j in T.Parallel(rows, cols):
            wr[r, j] = T.if_then_else(j < plan.n, W[j], T.cast(0, plan.dtype))
    if br is not None:
        for r, j in T.Parallel(rows, cols):
            br[r, j] = T.if_then_else(j < plan.n, B[j], T.cast(0, plan.dtype))


def _signature_sizes(plan: Plan):
    return (plan.n if plan.has_weight else 1), (plan.n if plan.has_bias else 1)
