"""The TileLang backward pass (program: _bwd_programs.norm_bwd), attached to every TileLang
kernel: all of them save rstd (and LayerNorm's mean) in the same layout, so the RMSNorm variants
share one backward kernel. Plain Python until a kernel is compiled.

- dx: one kernel, one row at a time, the row padded in registers as the forward pads it.
- dw, db: the kernel writes float32 partial sums per block of BWD_BLOCK_M rows (a constant, never
  chosen from M); torch sums the partials over blocks in float32 (``sum(0)``: a reduction without
  atomics) and rounds once into the caller's buffer. Deterministic; the grouping of rows is fixed.
- Rows up to BWD_MAX_N: the backward holds x, dy and five float32 rows in registers.
"""
from __future__ import annotations

import torch

from impls.base import NormGrads, NormOutputs, UnsupportedCase
from impls.gpu_limits import cdiv, next_pow2
from impls.tilelang import compiler
from impls.tilelang.plan import MAX_THREADS, Plan, choose_vec

BWD_BLOCK_M = 32
BWD_MAX_N = 8192
BWD_VECTORS = 2  # vectors per thread per row fragment


def backward_plan(op: str, dtype, n: int, has_weight: bool, vec: int) -> Plan:
    dt = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    tpr = min(MAX_THREADS, max(32, next_pow2(cdiv(cdiv(n, vec), BWD_VECTORS))))
    padded = cdiv(n, tpr * vec) * tpr * vec
    return Plan(f"{op}_bwd", dt, n, has_weight, op == "layer_norm", vec, tpr, 1, padded)


def _flat(t: torch.Tensor) -> torch.Tensor:
    m, n = t.shape
    return t.as_strided(((m - 1) * t.stride(0) + n,), (1,))


class TileLangBackward:
    """Mixin of TileLangKernel: ``_backward``, and the backward's offline builds."""

    backward_nondeterministic = None
    backward_batch_invariant = True  # one plan for every M; each row's dx alone in its block

    # (dtype, N, affine): a padded N with 16-byte vectors, the capacity edge (the most registers),
    # and for LayerNorm an odd N (scalar accesses; the program is the same for both ops).
    BACKWARD_BUILDS = (("bfloat16", 4000, "full"), ("bfloat16", BWD_MAX_N, "full"))
    BACKWARD_BUILDS_LN = (("float32", 769, "full"),)

    def backward_builds(self) -> tuple:
        """The backward's offline builds, ("backward", dtype, N, affine): declared by one kernel
        per op (the RMSNorm variants share the program)."""
        if self.variant not in ("fragment", "layer_norm_fwd"):
            return ()
        extra = self.BACKWARD_BUILDS_LN if self.op == "layer_norm" else ()
        return tuple(("backward", *b) for b in self.BACKWARD_BUILDS + extra)

    def backward_build_plan(self, build) -> Plan:
        """The plan of one of ``backward_builds`` (compiled by TileLangKernel.build_offline)."""
        _, dtype, n, affine = build
        dt = getattr(torch, dtype)
        return backward_plan(self.op, dt, n, affine == "full", choose_vec(dt, n))

    def backward_unsupported(self, spec) -> str | None:
        if spec.n > BWD_MAX_N:  # true on any machine, so said first (as the forward's capacity)
            return f"N={spec.n} exceeds tilelang's backward capacity (max {BWD_MAX_N})"
        return super().backward_unsupported(spec)

    def _backward(self, x, weight, bias, dy, saved: NormOutputs, eps, out: NormGrads) -> None:
        m, n = x.shape
        if n > BWD_MAX_N:
            raise UnsupportedCase(f"N={n} exceeds tilelang's backward capacity (max {BWD_MAX_N})")
        strides = (x.stride(0), dy.stride(0), out.dx.stride(0)) if m > 1 else ()
        offsets = tuple((t.data_ptr() % 16) // t.element_size() for t in (x, dy, out.dx, weight) if t is not None)
        plan = backward_plan(self.op, x.dtype, n, weight is not None, choose_vec(x.dtype, n, strides, offsets))
        compiled = compiler.compile_plan(plan)
        groups = cdiv(m, BWD_BLOCK_M)
        f32 = dict(dtype=torch.float32, device=x.device)
        dwp, dbp = torch.empty(groups, n, **f32), torch.empty(groups, n, **f32)
        w = weight if weight is not None else x.new_zeros(1)
        mean = saved.mean if saved.mean is not None else saved.rstd  # RMSNorm: never read
        v = plan.vec
        with torch.cuda.device(x.device):
            compiled.kernel(_flat(x), _flat(dy), w, mean, saved.rstd, _flat(out.dx), dwp, dbp,
                            x.stride(0) // v if m > 1 else 0, dy.stride(0) // v if m > 1 else 0,
                            out.dx.stride(0) // v if m > 1 else 0)
        if out.dw is not None:
            out.dw.copy_(dwp.sum(0))
        if out.db is not None:
            out.db.copy_(dbp.sum(0))
